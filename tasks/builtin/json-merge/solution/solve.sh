#!/usr/bin/env bash
# Oracle solution for json-merge.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
python3 - <<'EOF'
import json

def merge(base, over):
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out

with open("merged.json", "w") as f:
    json.dump(merge(json.load(open("defaults.json")), json.load(open("overrides.json"))), f, indent=2)
EOF
