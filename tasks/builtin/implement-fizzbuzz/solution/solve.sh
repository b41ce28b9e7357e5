#!/usr/bin/env bash
# Oracle solution for implement-fizzbuzz.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > fizz.py <<'EOF'
def fizzbuzz(n):
    """Return the FizzBuzz strings for 1..n."""
    out = []
    for i in range(1, n + 1):
        word = ("Fizz" if i % 3 == 0 else "") + ("Buzz" if i % 5 == 0 else "")
        out.append(word or str(i))
    return out
EOF
