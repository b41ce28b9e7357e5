#!/usr/bin/env bash
# Oracle solution for touch-test: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
touch test.txt
