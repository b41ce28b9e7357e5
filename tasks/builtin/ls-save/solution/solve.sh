#!/usr/bin/env bash
# Oracle solution for ls-save: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
ls -la > listing.txt
