#!/usr/bin/env bash
# Oracle solution for run-make-clean: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
make clean
