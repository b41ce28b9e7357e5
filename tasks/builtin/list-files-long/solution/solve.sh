#!/usr/bin/env bash
# Oracle solution for list-files-long: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
ls -l > long.txt
