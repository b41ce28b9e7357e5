#!/usr/bin/env bash
# Oracle solution for implement-palindrome.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > text_utils.py <<'EOF'
def is_palindrome(text):
    """True when ``text`` reads the same backwards, ignoring case and anything that is not a letter or digit."""
    kept = [c.lower() for c in text if c.isalnum()]
    return kept == kept[::-1]
EOF
