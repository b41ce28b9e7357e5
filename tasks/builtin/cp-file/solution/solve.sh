#!/usr/bin/env bash
# Oracle solution for cp-file: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cp file.txt copy.txt
