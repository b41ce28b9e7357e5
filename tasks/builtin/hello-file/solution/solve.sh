#!/usr/bin/env bash
# Oracle solution for hello-file.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
echo hello > hello.txt
