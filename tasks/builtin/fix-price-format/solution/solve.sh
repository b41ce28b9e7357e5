#!/usr/bin/env bash
# Oracle solution for fix-price-format.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > money.py <<'EOF'
def format_price(cents):
    """Format an amount in cents as dollars, e.g. 350 -> "$3.50", 5 -> "$0.05", -1999 -> "-$19.99"."""
    sign = "-" if cents < 0 else ""
    dollars, rest = divmod(abs(cents), 100)
    return f"{sign}${dollars}.{rest:02d}"
EOF
