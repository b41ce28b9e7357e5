#!/usr/bin/env bash
# Oracle solution for cp-a-b: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cp a.txt b.txt
