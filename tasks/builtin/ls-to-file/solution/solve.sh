#!/usr/bin/env bash
# Oracle solution for ls-to-file: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
ls > list.txt
