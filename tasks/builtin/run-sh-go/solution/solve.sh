#!/usr/bin/env bash
# Oracle solution for run-sh-go: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
sh go
