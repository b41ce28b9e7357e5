#!/usr/bin/env bash
# Oracle solution for save-listing: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
ls -la > ls.txt
