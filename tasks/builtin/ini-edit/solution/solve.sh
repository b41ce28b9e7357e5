#!/usr/bin/env bash
# Oracle solution for ini-edit.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
python3 - <<'EOF'
import configparser
cp = configparser.ConfigParser()
cp.read("settings.ini")
cp["database"]["port"] = "5433"
cp["cache"] = {"enabled": "true", "ttl": "300"}
with open("settings.ini", "w") as f:
    cp.write(f)
EOF
