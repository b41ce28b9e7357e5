#!/usr/bin/env bash
# Oracle solution for env-file.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
printf 'PORT=8080\nHOST=127.0.0.1\n' > .env
