#!/usr/bin/env bash
# Oracle solution for implement-rle.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > rle.py <<'EOF'
import itertools
import re


def encode(text):
    """Run-length encode: "aaabcc" -> "3a1b2c"."""
    return "".join(f"{len(list(group))}{ch}" for ch, group in itertools.groupby(text))


def decode(encoded):
    """Inverse of encode: "3a1b2c" -> "aaabcc". ValueError on malformed input."""
    parts = re.findall(r"(\d+)(\D)", encoded)
    if "".join(n + c for n, c in parts) != encoded:
        raise ValueError(f"malformed run-length text {encoded!r}")
    if any(int(n) == 0 for n, _ in parts):
        raise ValueError("zero-length run")
    return "".join(c * int(n) for n, c in parts)
EOF
