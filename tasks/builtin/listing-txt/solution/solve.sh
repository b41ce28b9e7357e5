#!/usr/bin/env bash
# Oracle solution for listing-txt: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
ls -la >> log.txt
