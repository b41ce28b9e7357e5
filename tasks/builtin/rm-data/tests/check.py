"""Hidden check for rm-data: data.md deleted, keep.txt kept

Usage: check.py WORKSPACE REWARD_FILE. Reward 1 when it holds, else 0.
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])


def text(name):
    path = WORK / name
    return path.read_text(errors="replace") if path.is_file() else None


def holds():
    return text("data.md") is None and text("keep.txt") == "keep me\n"


ok = holds()
print(("PASS" if ok else "FAIL") + ": data.md deleted, keep.txt kept")
REWARD.write_text("1\n" if ok else "0\n")
