#!/usr/bin/env bash
# Oracle solution for append-line.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
echo 'buy milk' >> todo.txt
