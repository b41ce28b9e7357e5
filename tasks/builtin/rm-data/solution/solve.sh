#!/usr/bin/env bash
# Oracle solution for rm-data: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
rm data.md
