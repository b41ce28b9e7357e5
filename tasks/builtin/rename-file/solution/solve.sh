#!/usr/bin/env bash
# Oracle solution for rename-file.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mv notes.txt README.md
