"""Hidden check for run-bash: did the one instructed command run? It leaves setup.log from setup.sh.

Usage: check.py WORKSPACE REWARD_FILE. Reward 1 when it did, else 0 (pass/fail: the effect is all or nothing).
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])


def holds():
    path = WORK / "setup.log"
    return path.is_file() and path.read_text(errors="replace") == "set up 1207\n"


ok = holds()
print(("PASS" if ok else "FAIL") + ": setup.log holds what setup.sh writes")
REWARD.write_text("1\n" if ok else "0\n")
