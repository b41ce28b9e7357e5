#!/usr/bin/env bash
# Oracle solution for implement-json-path.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > lookup.py <<'EOF'
import re

_STEP = re.compile(r"^([^\[\]]*)((?:\[\d+\])*)$")


def get_path(data, path, default=None):
    """Value at ``path`` in nested dicts/lists, e.g. "users[1].name"; ``default`` when any step is missing."""
    if path == "":
        return data
    node = data
    for part in path.split("."):
        match = _STEP.match(part)
        if match is None:
            return default
        key, indices = match.groups()
        steps = ([key] if key else []) + [int(i) for i in re.findall(r"\d+", indices)]
        for step in steps:
            if isinstance(step, str) and isinstance(node, dict) and step in node:
                node = node[step]
            elif isinstance(step, int) and isinstance(node, list) and step < len(node):
                node = node[step]
            else:
                return default
    return node
EOF
