#!/usr/bin/env bash
# Oracle solution for implement-roman.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > roman.py <<'EOF'
_SYMBOLS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"), (50, "L"), (40, "XL"),
            (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]


def to_roman(number):
    """Roman numeral for 1 <= number <= 3999; ValueError outside that range."""
    if not 1 <= number <= 3999:
        raise ValueError(f"{number} is outside 1..3999")
    out = []
    for value, symbol in _SYMBOLS:
        count, number = divmod(number, value)
        out.append(symbol * count)
    return "".join(out)
EOF
