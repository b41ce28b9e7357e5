"""Hidden check for run-sh-go: did the one instructed command run? It leaves went.txt from the go script.

Usage: check.py WORKSPACE REWARD_FILE. Reward 1 when it did, else 0 (pass/fail: the effect is all or nothing).
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])


def holds():
    path = WORK / "went.txt"
    return path.is_file() and path.read_text(errors="replace") == "went 2207\n"


ok = holds()
print(("PASS" if ok else "FAIL") + ": went.txt holds what `sh go` writes")
REWARD.write_text("1\n" if ok else "0\n")
