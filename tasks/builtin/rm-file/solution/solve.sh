#!/usr/bin/env bash
# Oracle solution for rm-file: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
rm file.txt
