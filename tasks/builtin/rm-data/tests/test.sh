#!/usr/bin/env bash
# Verifier for rm-data: check.py looks at the workspace, prints what it found and writes the reward.
# Paths: the runner sets TASK_WORKDIR, TESTS_DIR and REWARD_FILE; under Harbor the defaults apply.
set -u
WORK="${TASK_WORKDIR:-/app}"
TESTS="${TESTS_DIR:-/tests}"
REWARD="${REWARD_FILE:-/logs/verifier/reward.txt}"
mkdir -p "$(dirname "$REWARD")"
echo 0 > "$REWARD"  # stays 0 if check.py dies before writing a reward
python3 "$TESTS/check.py" "$WORK" "$REWARD"
