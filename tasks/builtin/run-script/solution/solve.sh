#!/usr/bin/env bash
# Oracle solution for run-script: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
./run
