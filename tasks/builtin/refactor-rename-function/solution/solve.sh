#!/usr/bin/env bash
# Oracle solution for refactor-rename-function.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
grep -rl calc_total --include='*.py' . | xargs sed -i 's/calc_total/compute_total/g'
