#!/usr/bin/env bash
# Oracle solution for extract-module.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
python3 - <<'EOF'
src = open("app.py").read()
head, rest = src.split("def signup", 1)
validators = head.rstrip() + "\n"
open("validators.py", "w").write(validators)
open("app.py", "w").write("from validators import validate_email, validate_phone\n\n\ndef signup" + rest)
EOF
