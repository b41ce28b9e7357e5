#!/usr/bin/env bash
# Oracle solution for warmup-touch.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
touch done.txt
