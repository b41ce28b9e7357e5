#!/usr/bin/env bash
# Oracle solution for mkdir-test: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mkdir test
