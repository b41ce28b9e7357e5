"""Tiny Harbor-format tasks written into a temp folder, for the task-set, workspace and oracle tests.

``make_task(root, name, ...)`` writes instruction.md, task.toml, tests/test.sh and optionally environment files and
solution/solve.sh; every piece can be replaced (or left out with ``None``) to build a malformed task.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_TOML = """\
version = "1.0"

[metadata]
difficulty = "easy"
category = "file-ops"
tags = ["demo"]

[verifier]
timeout_sec = 20.0

[agent]
timeout_sec = 60.0
"""

# Passes when done.txt says "done"; prints why otherwise.
DEFAULT_TEST = """\
#!/usr/bin/env bash
REWARD="${REWARD_FILE:-/logs/verifier/reward.txt}"
if [ "$(cat "${TASK_WORKDIR:-/app}/done.txt" 2>/dev/null)" = done ]; then
  echo 1 > "$REWARD"
else
  echo "done.txt does not say done"
  echo 0 > "$REWARD"
fi
"""

DEFAULT_SOLVE = """\
#!/usr/bin/env bash
cd "${TASK_WORKDIR:-/app}"
echo done > done.txt
"""


def make_task(
    root: Path,
    name: str = "demo-task",
    *,
    instruction: str | None = "Write done into done.txt.\n",
    toml: str | None = DEFAULT_TOML,
    test_sh: str | None = DEFAULT_TEST,
    solve_sh: str | None = DEFAULT_SOLVE,
    files: dict[str, str] | None = None,
) -> Path:
    """Write a task folder ``root/name`` and return it."""
    task = root / name
    task.mkdir(parents=True)
    pieces = {"instruction.md": instruction, "task.toml": toml, "tests/test.sh": test_sh, "solution/solve.sh": solve_sh}
    pieces.update({f"environment/{k}": v for k, v in (files or {}).items()})
    for rel, text in pieces.items():
        if text is not None:
            path = task / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return task
