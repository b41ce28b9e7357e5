#!/usr/bin/env bash
# Oracle solution for mv-a-b: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mv a.txt b.txt
