#!/usr/bin/env bash
# Oracle solution for warmup-copy.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cp greeting.txt copy.txt
