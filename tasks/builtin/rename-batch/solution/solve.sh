#!/usr/bin/env bash
# Oracle solution for rename-batch.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
for f in photos/*.jpeg; do mv "$f" "${f%.jpeg}.jpg"; done
