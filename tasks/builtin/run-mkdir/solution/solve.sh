#!/usr/bin/env bash
# Oracle solution for run-mkdir: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mkdir out
