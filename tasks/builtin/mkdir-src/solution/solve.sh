#!/usr/bin/env bash
# Oracle solution for mkdir-src: the instructed command.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
mkdir src
