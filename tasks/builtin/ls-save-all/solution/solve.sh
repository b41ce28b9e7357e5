#!/usr/bin/env bash
# Oracle solution for ls-save-all: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
ls -a > all.txt
