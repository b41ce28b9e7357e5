#!/usr/bin/env bash
# Oracle solution for executable-script.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
printf '#!/bin/sh\necho ok\n' > run.sh
chmod +x run.sh
