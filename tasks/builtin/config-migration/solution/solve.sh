#!/usr/bin/env bash
# Oracle solution for config-migration.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > config/app.toml <<'EOF'
features = ["search", "export"]

[database]
host = "db.local"
port = 5432
user = "app"

[cache]
enabled = true
ttl = 60
EOF
rm config/old.json
