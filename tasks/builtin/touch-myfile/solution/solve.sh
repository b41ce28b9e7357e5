#!/usr/bin/env bash
# Oracle solution for touch-myfile: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
touch myfile.txt
