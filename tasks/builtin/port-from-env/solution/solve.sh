#!/usr/bin/env bash
# Oracle solution for port-from-env.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > server.py <<'EOF'
import os


def get_port():
    """The port to listen on: $PORT when set, else 8000."""
    return int(os.environ.get("PORT", "8000"))
EOF
