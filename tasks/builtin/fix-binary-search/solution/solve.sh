#!/usr/bin/env bash
# Oracle solution for fix-binary-search.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > search.py <<'EOF'
def find(sorted_items, target):
    """Index of ``target`` in ``sorted_items`` (ascending), or -1 when absent."""
    lo, hi = 0, len(sorted_items)
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_items[mid] < target:
            lo = mid + 1
        elif sorted_items[mid] > target:
            hi = mid
        else:
            return mid
    return -1
EOF
