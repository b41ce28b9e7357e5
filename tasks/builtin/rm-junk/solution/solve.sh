#!/usr/bin/env bash
# Oracle solution for rm-junk: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
rm junk.txt
