"""Hidden check for listing-txt: is the listing of the workspace saved in log.txt?

Usage: check.py WORKSPACE REWARD_FILE. Reward 1 when log.txt names every file the workspace was given and keeps its first line,
else 0.
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])
GIVEN = ("data.csv", "notes.md")  # the files in the workspace before the agent ran


def holds():
    path = WORK / "log.txt"
    if not path.is_file():
        print("FAIL: log.txt does not exist")
        return False
    text = path.read_text(errors="replace")
    missing = [name for name in GIVEN if name not in text]
    if missing:
        print("FAIL: log.txt does not list " + ", ".join(missing))
        return False
    if not text.startswith("listing log\n"):
        print("FAIL: log.txt lost its first line")
        return False
    return True


ok = holds()
print("PASS: log.txt holds the listing" if ok else "reward 0")
REWARD.write_text("1\n" if ok else "0\n")
