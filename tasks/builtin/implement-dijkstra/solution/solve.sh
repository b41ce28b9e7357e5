#!/usr/bin/env bash
# Oracle solution for implement-dijkstra.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > graph.py <<'EOF'
import heapq
import itertools


def shortest_path(graph, start, goal):
    """Cheapest path from ``start`` to ``goal``.

    ``graph`` maps a node to a dict of {neighbour: non-negative edge cost}. Returns (cost, [start, ..., goal]),
    or None when ``goal`` cannot be reached.
    """
    tie = itertools.count()
    queue = [(0, next(tie), start)]
    best = {start: 0}
    parent = {}
    while queue:
        cost, _, node = heapq.heappop(queue)
        if node == goal:
            path = [node]
            while path[-1] != start:
                path.append(parent[path[-1]])
            return cost, path[::-1]
        if cost > best.get(node, float("inf")):
            continue
        for nxt, weight in graph.get(node, {}).items():
            new = cost + weight
            if new < best.get(nxt, float("inf")):
                best[nxt], parent[nxt] = new, node
                heapq.heappush(queue, (new, next(tie), nxt))
    return None
EOF
