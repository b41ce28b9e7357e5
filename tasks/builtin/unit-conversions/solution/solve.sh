#!/usr/bin/env bash
# Oracle solution for unit-conversions.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > units.py <<'EOF'
"""Unit conversions. Each function takes and returns a float."""


def c_to_f(celsius):
    return celsius * 9 / 5 + 32


def km_to_miles(km):
    return km / 1.609344


def kg_to_pounds(kg):
    return kg / 0.45359237


def liters_to_gallons(liters):
    """US gallons."""
    return liters / 3.785411784
EOF
