"""Hidden check for save-listing: is the listing of the workspace saved in ls.txt?

Usage: check.py WORKSPACE REWARD_FILE. Reward 1 when ls.txt names every file the workspace was given,
else 0.
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])
GIVEN = ("data.csv", "notes.md")  # the files in the workspace before the agent ran


def holds():
    path = WORK / "ls.txt"
    if not path.is_file():
        print("FAIL: ls.txt does not exist")
        return False
    text = path.read_text(errors="replace")
    missing = [name for name in GIVEN if name not in text]
    if missing:
        print("FAIL: ls.txt does not list " + ", ".join(missing))
        return False
    return True


ok = holds()
print("PASS: ls.txt holds the listing" if ok else "reward 0")
REWARD.write_text("1\n" if ok else "0\n")
