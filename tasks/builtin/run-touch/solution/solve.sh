#!/usr/bin/env bash
# Oracle solution for run-touch: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
touch ok
