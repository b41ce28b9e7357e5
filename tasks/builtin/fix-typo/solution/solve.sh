#!/usr/bin/env bash
# Oracle solution for fix-typo.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
sed -i 's/Helo, world/Hello, world/' greeting.py
