"""Hidden check for run-make: did the one instructed command run? It leaves build.txt from the Makefile's default target.

Usage: check.py WORKSPACE REWARD_FILE. Reward 1 when it did, else 0 (pass/fail: the effect is all or nothing).
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])


def holds():
    path = WORK / "build.txt"
    return path.is_file() and path.read_text(errors="replace") == "built 4131\n"


ok = holds()
print(("PASS" if ok else "FAIL") + ": build.txt holds what `make` writes")
REWARD.write_text("1\n" if ok else "0\n")
