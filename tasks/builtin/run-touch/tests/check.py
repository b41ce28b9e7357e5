"""Hidden check for run-touch: did the one instructed command run? It leaves a file named ok.

Usage: check.py WORKSPACE REWARD_FILE. Reward 1 when it did, else 0 (pass/fail: the effect is all or nothing).
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])


def holds():
    return (WORK / "ok").is_file()


ok = holds()
print(("PASS" if ok else "FAIL") + ": a file named ok exists")
REWARD.write_text("1\n" if ok else "0\n")
