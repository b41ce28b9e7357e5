#!/usr/bin/env bash
# Oracle solution for implement-lru-cache.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > lru.py <<'EOF'
from collections import OrderedDict


class LRUCache:
    """A fixed-capacity cache that evicts the least recently used key."""

    def __init__(self, capacity):
        self.capacity = capacity
        self._data = OrderedDict()

    def __len__(self):
        return len(self._data)

    def get(self, key):
        """The value for ``key`` (marking it most recently used), or None."""
        if key not in self._data:
            return None
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key, value):
        """Store ``value``; evict the least recently used key when over capacity."""
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)
EOF
