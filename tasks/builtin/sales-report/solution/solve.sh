#!/usr/bin/env bash
# Oracle solution for sales-report.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
python3 - <<'EOF'
import csv, json
totals = {}
for row in csv.DictReader(open("sales.csv")):
    totals[row["region"]] = totals.get(row["region"], 0.0) + float(row["amount"])
report = {k: round(v, 2) for k, v in totals.items()}
report["total"] = round(sum(totals.values()), 2)
json.dump(report, open("report.json", "w"), indent=2)
EOF
