#!/usr/bin/env bash
# Oracle solution for fix-mutable-default.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > registry.py <<'EOF'
def register(name, registry=None):
    """Add ``name`` to ``registry`` (a new list when none is given) and return the registry."""
    if registry is None:
        registry = []
    registry.append(name)
    return registry
EOF
