#!/usr/bin/env bash
# Oracle solution for mv-file: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mv file.txt file2.txt
