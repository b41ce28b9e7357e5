#!/usr/bin/env bash
# Oracle solution for csv-to-json.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
python3 - <<'EOF'
import csv, json
rows = [{**r, "age": int(r["age"])} for r in csv.DictReader(open("people.csv"))]
json.dump(rows, open("people.json", "w"), indent=2)
EOF
