#!/usr/bin/env bash
# Oracle solution for repo-question-entrypoint.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
echo launch > answer.txt
