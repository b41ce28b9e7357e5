#!/usr/bin/env bash
# Oracle solution for repo-question-todo-count.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
grep -rho --include='*.py' 'TODO' src | wc -l | tr -d ' ' > answer.txt
