#!/usr/bin/env bash
# Oracle solution for gitignore-add.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
printf '__pycache__/\n*.log\n' >> .gitignore
