"""Hidden checks for warmup task warmup-mkdir: partial credit, so a weak model's attempts get different rewards.

Usage: check.py WORKSPACE REWARD_FILE. Each rung of the ladder below is worth its score only when every rung
before it holds; the reward is the highest rung reached. Hidden files (a harness's own state) never count.
"""

import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])
GIVEN = {}  # the workspace's files before the agent ran: name -> content


def text(name):
    path = WORK / name
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None


def changed():
    """The agent made something: a visible entry that was not given, or a given file with other content. Deleting
    alone does not count (a shaping reward must not pay for destruction)."""
    for path in WORK.iterdir():
        if path.name.startswith("."):
            continue
        if path.name not in GIVEN or text(path.name) != GIVEN[path.name]:
            return True
    return False


LADDER = [
    (0.5, "something made in the workspace", lambda: changed()),
    (1.0, "results is a folder", lambda: (WORK / "results").is_dir()),
]

score = 0.0
for value, label, holds in LADDER:
    ok = bool(holds())
    print(("PASS" if ok else "FAIL") + f": {label} ({value:g})")
    if not ok:
        break
    score = value
print(f"reward {score:g}")
REWARD.write_text(f"{score:g}\n")
