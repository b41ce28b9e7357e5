#!/usr/bin/env bash
# Oracle solution for run-python: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
python3 gen.py
