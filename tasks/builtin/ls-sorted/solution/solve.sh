#!/usr/bin/env bash
# Oracle solution for ls-sorted: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
ls -la | sort > sorted.txt
