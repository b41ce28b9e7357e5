#!/usr/bin/env bash
# Oracle solution for implement-topo-sort.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > deps.py <<'EOF'
import heapq


def build_order(deps):
    """Order to build packages in (see the task): dependencies first, alphabetical tie-break, ValueError on a cycle."""
    nodes = set(deps) | {d for ds in deps.values() for d in ds}
    waiting = {n: set(deps.get(n, ())) for n in nodes}
    users = {n: [] for n in nodes}
    for n, ds in waiting.items():
        for d in ds:
            users[d].append(n)
    ready = [n for n, ds in waiting.items() if not ds]
    heapq.heapify(ready)
    order = []
    while ready:
        n = heapq.heappop(ready)
        order.append(n)
        for u in users[n]:
            waiting[u].discard(n)
            if not waiting[u]:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        stuck = sorted(n for n in nodes if waiting[n])
        raise ValueError(f"dependency cycle involving {stuck[0]}")
    return order
EOF
