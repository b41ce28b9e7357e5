#!/usr/bin/env bash
# Oracle solution for ls-la-to-file: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
ls -la > files.txt
