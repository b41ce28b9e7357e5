#!/usr/bin/env bash
# Oracle solution for sort-log-lines.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
sort app.log > sorted.log
