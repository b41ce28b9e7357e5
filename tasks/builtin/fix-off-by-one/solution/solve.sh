#!/usr/bin/env bash
# Oracle solution for fix-off-by-one.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
sed -i 's/start = number \* size/start = (number - 1) * size/' paginate.py
