#!/usr/bin/env bash
# Oracle solution for warmup-mkdir.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mkdir results
