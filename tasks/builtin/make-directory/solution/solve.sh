#!/usr/bin/env bash
# Oracle solution for make-directory.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mkdir -p build/output
: > build/output/.keep
