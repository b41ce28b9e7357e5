#!/usr/bin/env bash
# Oracle solution for ls-tee: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
ls -la | tee out.txt
