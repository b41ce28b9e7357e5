"""Hidden checks for task fix-mutable-default.

Usage: check.py WORKSPACE REWARD_FILE. Prints each problem found, then writes the reward.
"""

import importlib
import signal
import sys
from pathlib import Path

WORK = Path(sys.argv[1])
REWARD = Path(sys.argv[2])
problems = []


def need(cond, why):
    """Record ``why`` as a problem unless ``cond`` holds; return ``cond``."""
    if not cond:
        problems.append(why)
    return bool(cond)


def read(name):
    """Text of a workspace file, or None (recorded as a problem) when it is missing."""
    path = WORK / name
    if not path.is_file():
        problems.append(f"{name}: file is missing")
        return None
    return path.read_text(encoding="utf-8", errors="replace")


def _timeout(signum, frame):
    raise TimeoutError("took too long")


def load(module):
    """Import a module from the workspace (5 s limit), or None (recorded as a problem)."""
    if str(WORK) not in sys.path:
        sys.path.insert(0, str(WORK))
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(5)
    try:
        return importlib.import_module(module)
    except BaseException as e:  # any failure of the agent's code is a verdict, not a verifier crash
        problems.append(f"importing {module} failed: {type(e).__name__}: {e}")
        return None
    finally:
        signal.alarm(0)


def call(label, fn, *args, expect=None, raises=None):
    """Call ``fn(*args)`` (2 s limit) and record a problem unless it returns ``expect`` / raises ``raises``."""
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(2)
    try:
        got = fn(*args)
    except BaseException as e:  # any failure of the agent's code is a verdict
        if raises is not None and isinstance(e, raises):
            return True
        problems.append(f"{label}: raised {type(e).__name__}: {e}")
        return False
    finally:
        signal.alarm(0)
    if raises is not None:
        problems.append(f"{label}: expected {raises.__name__}, got {got!r}")
        return False
    return need(got == expect, f"{label}: expected {expect!r}, got {got!r}")


def finish(score=None):
    """Write the reward (1/0 from the problems, or ``score``) and say why."""
    if score is None:
        score = 0.0 if problems else 1.0
    for p in problems:
        print("FAIL:", p)
    print(f"reward {score:g}" + (" (all checks passed)" if not problems else ""))
    REWARD.write_text(f"{score:g}\n")


mod = load("registry")
if mod is not None:
    call("register('a')", mod.register, "a", expect=["a"])
    call("register('b')", mod.register, "b", expect=["b"])
    mine = ["x"]
    call("register('y', mine)", mod.register, "y", mine, expect=["x", "y"])
    need(mine == ["x", "y"], "register must append to the list it is given")
finish()
