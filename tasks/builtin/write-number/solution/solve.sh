#!/usr/bin/env bash
# Oracle solution for write-number.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
printf '42\n' > answer.txt
