#!/usr/bin/env bash
# Oracle solution for repo-question-definition.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
grep -rl '^def apply_discount' shop > answer.txt
