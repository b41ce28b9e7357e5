#!/usr/bin/env bash
# Oracle solution for json-set-field.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
python3 - <<'EOF'
import json
data = json.load(open("config.json"))
data["debug"] = True
json.dump(data, open("config.json", "w"), indent=2)
EOF
