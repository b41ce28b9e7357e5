#!/usr/bin/env bash
# Oracle solution for run-make-test: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
make test
