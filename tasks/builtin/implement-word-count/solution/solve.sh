#!/usr/bin/env bash
# Oracle solution for implement-word-count.
set -euo pipefail
cd "${TASK_WORKDIR:-/app}"
cat > words.py <<'EOF'
def word_counts(text):
    """Map each word (lower case, punctuation stripped) to the number of times it occurs in ``text``."""
    counts = {}
    for raw in text.split():
        word = raw.strip(".,;:!?\"'()").lower()
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts
EOF
