#!/usr/bin/env bash
# Oracle solution for delete-temp-files.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
find . -type f -name '*.tmp' -delete
