#!/usr/bin/env bash
# Oracle solution for uppercase-file.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
tr '[:lower:]' '[:upper:]' < whisper.txt > shout.txt
