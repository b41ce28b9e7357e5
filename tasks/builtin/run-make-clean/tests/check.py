"""Hidden check for run-make-clean: did the one instructed command run? It leaves clean.log and no cache.tmp.

Usage: check.py WORKSPACE REWARD_FILE. Reward 1 when it did, else 0 (pass/fail: the effect is all or nothing).
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])


def holds():
    return not (WORK / "cache.tmp").exists() and (WORK / "clean.log").is_file() and (WORK / "clean.log").read_text(errors="replace") == "cleaned 72\n"


ok = holds()
print(("PASS" if ok else "FAIL") + ": cache.tmp removed and clean.log written by `make clean`")
REWARD.write_text("1\n" if ok else "0\n")
