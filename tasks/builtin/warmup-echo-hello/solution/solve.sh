#!/usr/bin/env bash
# Oracle solution for warmup-echo-hello.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
echo hello > hello.txt
