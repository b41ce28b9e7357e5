#!/usr/bin/env bash
# Oracle solution for implement-dedupe.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > seq.py <<'EOF'
def dedupe(items):
    """Items without repeats, first occurrence kept, order preserved."""
    return list(dict.fromkeys(items))
EOF
