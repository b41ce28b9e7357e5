#!/usr/bin/env bash
# Oracle solution for run-sh: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
sh build.sh
