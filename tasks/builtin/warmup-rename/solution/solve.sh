#!/usr/bin/env bash
# Oracle solution for warmup-rename.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mv draft.txt final.txt
