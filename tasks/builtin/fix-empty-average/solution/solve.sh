#!/usr/bin/env bash
# Oracle solution for fix-empty-average.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > stats.py <<'EOF'
def average(values):
    """Arithmetic mean of ``values``; 0.0 for an empty sequence."""
    if not values:
        return 0.0
    return sum(values) / len(values)
EOF
