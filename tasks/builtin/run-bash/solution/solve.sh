#!/usr/bin/env bash
# Oracle solution for run-bash: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
bash setup.sh
