"""The oracle check: every task must be solvable by its own solution and must not pass untouched.

Contract
--------
For each task, :func:`check_task` prepares two fresh workspaces from the task's environment:

* **untouched**: the verifier runs on it as prepared; it must write a reward, and the reward must be 0 (a task that
  passes before the agent does anything teaches nothing);
* **solved**: ``solution/solve.sh`` runs first and must exit 0; the verifier must then give the task's
  ``max_reward`` (``VerifierResult.passed``).

:func:`check_taskset` runs the tasks in parallel threads (each task's scripts are subprocesses, so threads suffice)
and reports each finished task to an optional callback. ``python -m tasks.oracle [--tasks DIR] [--subset NAME]
[--jobs N] [--sandbox none|namespaces]`` prints a progress line, a summary table and the counts per difficulty, and
exits 1 naming every failing task with its problems. With ``--sandbox namespaces`` the scripts run as ``make
collect`` runs verifiers: in the sandbox, with the Harbor paths (``/app``, ``/tests``, ``/logs``) mapped.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from tasks.sandbox import SandboxConfig, SandboxError, check_available
from tasks.taskset import BUILTIN_DIR, Task, TaskFormatError, TaskSet, load_taskset
from tasks.workspace import VerifierResult, prepare_workspace, run_solution, run_verifier


@dataclass(frozen=True)
class OracleOutcome:
    """The oracle verdict on one task. ``problems`` is empty when the task is sound."""

    task: Task
    untouched: VerifierResult | None
    solved: VerifierResult | None
    problems: tuple[str, ...]
    duration_s: float

    @property
    def ok(self) -> bool:
        return not self.problems


def check_task(task: Task, sandbox: SandboxConfig | None = None) -> OracleOutcome:
    """Run the untouched and the solved check for one task (see the module docstring)."""
    start = time.monotonic()
    problems: list[str] = []
    untouched = solved = None
    with tempfile.TemporaryDirectory(prefix=f"harnessrl-oracle-{task.id}-", ignore_cleanup_errors=True) as root:
        try:
            prepare_workspace(task, Path(root) / "untouched")
            untouched = run_verifier(task, Path(root) / "untouched", sandbox=sandbox)
            if untouched.status != "ok" or untouched.reward != 0:
                problems.append(f"untouched workspace: reward {untouched.reward:g} ({untouched.status}), must be 0\n"
                                f"{_indent(untouched.output_tail)}")  # fmt: skip
            if task.solution_script is None:
                problems.append("no solution/solve.sh to check against")
            else:
                prepare_workspace(task, Path(root) / "solved")
                run = run_solution(task, Path(root) / "solved", sandbox=sandbox)
                if run.exit_status != 0:
                    why = "timed out" if run.timed_out else f"exited {run.exit_status}"
                    problems.append(f"solution/solve.sh {why}\n{_indent(run.output_tail)}")
                solved = run_verifier(task, Path(root) / "solved", sandbox=sandbox)
                if not solved.passed:
                    problems.append(f"solved workspace: reward {solved.reward:g} ({solved.status}), "
                                    f"needs {task.max_reward:g}\n{_indent(solved.output_tail)}")  # fmt: skip
        except OSError as e:  # a task whose files cannot be copied or run is a failing task, not a crashed check
            problems.append(f"{type(e).__name__}: {e}")
    return OracleOutcome(task, untouched, solved, tuple(problems), time.monotonic() - start)


def check_taskset(
    taskset: TaskSet,
    jobs: int | None = None,
    progress: Callable[[int, int, OracleOutcome], None] | None = None,
    sandbox: SandboxConfig | None = None,
) -> list[OracleOutcome]:
    """Check every task with ``jobs`` threads (default: CPU count); results come back in task-set order."""
    workers = max(1, jobs or os.cpu_count() or 1)
    outcomes: dict[str, OracleOutcome] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="oracle") as pool:
        futures = [pool.submit(check_task, task, sandbox) for task in taskset]
        for done, future in enumerate(as_completed(futures), 1):
            outcome = future.result()
            outcomes[outcome.task.id] = outcome
            if progress is not None:
                progress(done, len(futures), outcome)
    return [outcomes[task.id] for task in taskset]


def summary_table(outcomes: Sequence[OracleOutcome]) -> str:
    """A fixed-width table: task, difficulty, untouched reward, solved reward, seconds, verdict."""
    width = max([len("task"), *(len(o.task.id) for o in outcomes)])
    lines = [f"{'task':<{width}}  {'difficulty':<10}  {'untouched':>9}  {'solved':>6}  {'secs':>5}  result"]
    for o in outcomes:
        before = f"{o.untouched.reward:g}" if o.untouched else "-"
        after = f"{o.solved.reward:g}" if o.solved else "-"
        verdict = "ok" if o.ok else "FAIL"
        lines.append(f"{o.task.id:<{width}}  {o.task.difficulty:<10}  {before:>9}  {after:>6}  "
                     f"{o.duration_s:>5.2f}  {verdict}")  # fmt: skip
    return "\n".join(lines)


def _indent(text: str, lines: int = 12) -> str:
    return "\n".join("    " + line for line in text.strip().splitlines()[-lines:])


def _progress_printer(stream: TextIO) -> Callable[[int, int, OracleOutcome], None]:
    tty = stream.isatty()

    def show(done: int, total: int, outcome: OracleOutcome) -> None:
        line = f"[{done:>3}/{total}] {'ok  ' if outcome.ok else 'FAIL'} {outcome.task.id}"
        stream.write(f"\r\033[K{line}" if tty else f"{line}\n")
        if tty and done == total:
            stream.write("\n")
        stream.flush()

    return show


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tasks.oracle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=Path, default=BUILTIN_DIR, help="a task directory or a directory of tasks")
    parser.add_argument("--subset", default="all", help="all, easy, medium, hard, or a tag (e.g. smoke)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="tasks checked in parallel")
    parser.add_argument("--sandbox", choices=("none", "namespaces"), default="none", help="run scripts sandboxed")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    sandbox = SandboxConfig() if args.sandbox == "namespaces" else None
    try:
        taskset = load_taskset(args.tasks).subset(args.subset)
        if sandbox is not None:
            check_available()
    except (TaskFormatError, KeyError, SandboxError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start = time.monotonic()
    outcomes = check_taskset(taskset, args.jobs, _progress_printer(sys.stderr), sandbox)
    wall = time.monotonic() - start
    print(summary_table(outcomes))
    per = Counter(o.task.difficulty for o in outcomes)
    print(f"\n{len(outcomes)} tasks ({', '.join(f'{k} {v}' for k, v in sorted(per.items()))}) "
          f"checked in {wall:.1f}s with {args.jobs} jobs")  # fmt: skip
    failing = [o for o in outcomes if not o.ok]
    if not failing:
        print("oracle check passed")
        return 0
    print(f"\noracle check FAILED for {len(failing)} task(s): {', '.join(o.task.id for o in failing)}")
    for o in failing:
        print(f"\n{o.task.id}:")
        for p in o.problems:
            print(f"  - {p}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
