#!/usr/bin/env bash
# Oracle solution for copy-file.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cp template.cfg app.cfg
