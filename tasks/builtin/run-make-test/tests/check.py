"""Hidden check for run-make-test: did the one instructed command run? It leaves report.txt from the Makefile's test target.

Usage: check.py WORKSPACE REWARD_FILE. Reward 1 when it did, else 0 (pass/fail: the effect is all or nothing).
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])


def holds():
    path = WORK / "report.txt"
    return path.is_file() and path.read_text(errors="replace") == "tests ok 5512\n"


ok = holds()
print(("PASS" if ok else "FAIL") + ": report.txt holds what `make test` writes")
REWARD.write_text("1\n" if ok else "0\n")
