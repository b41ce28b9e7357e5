#!/usr/bin/env bash
# Oracle solution for warmup-number.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
echo 7 > number.txt
