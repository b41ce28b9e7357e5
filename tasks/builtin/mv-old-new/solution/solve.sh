#!/usr/bin/env bash
# Oracle solution for mv-old-new: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mv old.txt new.txt
