#!/usr/bin/env bash
# Oracle solution for merge-intervals.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > intervals.py <<'EOF'
def merge(intervals):
    """Merge overlapping or touching [start, end] intervals; return them sorted by start."""
    out = []
    for start, end in sorted(tuple(i) for i in intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
EOF
