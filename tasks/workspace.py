"""Run a task's scripts against a workspace: prepare it, run the oracle solution, run the verifier, read the reward.

Contract
--------
``prepare_workspace(task, dest)`` copies the task's ``environment/`` into ``dest`` (created; must be empty or absent).
Container files there (Dockerfile, docker-compose.yaml, .dockerignore) are not applied -- this runner has no container
engine -- and ``Workspace.not_applied`` records each one. ``tests/`` and ``solution/`` never enter the workspace.

``run_solution(task, workspace)`` runs ``solution/solve.sh``; ``run_verifier(task, workspace)`` runs
``tests/test.sh`` and reads the reward. Both run ``bash SCRIPT`` with the workspace as working directory in a fresh
scratch directory of their own, which gives the script its own ``HOME`` and ``TMPDIR`` and a copy of the task's
``tests/`` (or ``solution/``) outside the workspace. The script runs in its own process group; the whole group is
killed when the timeout passes and when the script exits (so stray background processes die with it).

Harbor tasks assume fixed paths (``/app``, ``/tests``, ``/logs/verifier/reward.txt``). The scripts get the paths
through environment variables and use them with the Harbor path as fallback, e.g. ``${TASK_WORKDIR:-/app}``:

    TASK_WORKDIR   the workspace          TESTS_DIR      copy of tests/       SOLUTION_DIR   copy of solution/
    LOGS_DIR       Harbor's /logs         REWARD_FILE    $LOGS_DIR/verifier/reward.txt

By default (``sandbox=None``) these are the real paths in the scratch folder. With a namespaces
:class:`~tasks.sandbox.SandboxConfig` (what ``make collect`` uses) the script runs in the sandbox without network,
the workspace, tests/solution copy and logs are bind-mounted at the Harbor paths (``/app``, ``/tests``,
``/solution``, ``/logs``) and the variables hold those paths; nothing is written to the host's ``/app``.

The reward is the number in ``reward.txt``, or else ``reward.json``'s ``"reward"`` key (or its only metric), in the
directory of ``REWARD_FILE`` (Harbor's order). A missing or malformed reward, or a timeout, gives reward 0 with a
status saying why; the script's exit status is recorded but does not decide the reward (as in Harbor).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tasks.sandbox import Mount, SandboxConfig, sandboxed
from tasks.taskset import Task

CONTAINER_FILES = frozenset({"Dockerfile", "docker-compose.yaml", "docker-compose.yml", ".dockerignore"})
OUTPUT_TAIL_CHARS = 4000
# Passed through from the caller's environment; everything else a script sees is set here.
_INHERITED = ("PATH", "LANG", "TERM")

VerifierStatus = Literal["ok", "timeout", "no_reward", "bad_reward"]


@dataclass(frozen=True)
class Workspace:
    """A prepared workspace and what of the task's environment was not applied to it (with the reason)."""

    path: Path
    not_applied: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScriptResult:
    """One script run. ``exit_status`` is None when the script was killed on timeout."""

    exit_status: int | None
    timed_out: bool
    duration_s: float
    output_tail: str


@dataclass(frozen=True)
class VerifierResult:
    """The verifier's verdict. ``passed`` means the reward reached the task's ``max_reward``."""

    reward: float
    passed: bool
    status: VerifierStatus
    exit_status: int | None
    duration_s: float
    output_tail: str


def prepare_workspace(task: Task, dest: str | Path) -> Workspace:
    """Copy the task's environment into ``dest`` (see the module docstring)."""
    path = Path(dest).resolve()
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path}: workspace directory is not empty")
    path.mkdir(parents=True, exist_ok=True)
    not_applied: list[str] = []
    env_dir = task.environment_dir
    if not env_dir.is_dir():
        return Workspace(path)
    for entry in sorted(env_dir.iterdir()):
        if entry.name in CONTAINER_FILES:
            not_applied.append(f"environment/{entry.name}: not applied (no container engine in this runner)")
        elif entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, path / entry.name, symlinks=True)
        else:
            shutil.copy2(entry, path / entry.name, follow_symlinks=False)
    return Workspace(path, tuple(not_applied))


def run_solution(
    task: Task, workspace: str | Path, timeout_s: float | None = None, sandbox: SandboxConfig | None = None
) -> ScriptResult:
    """Run ``solution/solve.sh`` in the workspace (timeout: the task's agent timeout)."""
    script = task.solution_script
    if script is None:
        raise FileNotFoundError(f"{task.path / 'solution' / 'solve.sh'}: task {task.id} has no oracle solution")
    with tempfile.TemporaryDirectory(prefix=f"harnessrl-solve-{task.id}-", ignore_cleanup_errors=True) as scratch:
        paths = _scratch_layout(Path(scratch), task.path / "solution", "solution")
        timeout = timeout_s or task.agent_timeout_s
        return _run_task_script(Path(workspace), paths, "solution", task.solution_env, timeout, sandbox)


def run_verifier(
    task: Task,
    workspace: str | Path,
    timeout_s: float | None = None,
    extra_env: Mapping[str, str] | None = None,
    sandbox: SandboxConfig | None = None,
) -> VerifierResult:
    """Run ``tests/test.sh`` against the workspace and read the reward (timeout: the task's verifier timeout)."""
    with tempfile.TemporaryDirectory(prefix=f"harnessrl-verify-{task.id}-", ignore_cleanup_errors=True) as scratch:
        paths = _scratch_layout(Path(scratch), task.tests_dir, "tests")
        task_env = {**task.verifier_env, **(extra_env or {})}
        timeout = timeout_s or task.verifier_timeout_s
        run = _run_task_script(Path(workspace), paths, "tests", task_env, timeout, sandbox)
        verdict: tuple[float, VerifierStatus, str] = (
            (0.0, "timeout", f"verifier timed out after {run.duration_s:.1f}s")
            if run.timed_out
            else read_reward(paths["logs"] / "verifier" / "reward.txt")
        )
    reward, status, why = verdict
    tail = run.output_tail if not why else f"{run.output_tail}\n[harnessrl] {why}"[-OUTPUT_TAIL_CHARS:]
    return VerifierResult(
        reward=reward,
        passed=status == "ok" and reward >= task.max_reward - 1e-9,
        status=status,
        exit_status=run.exit_status,
        duration_s=run.duration_s,
        output_tail=tail,
    )


def read_reward(reward_txt: Path) -> tuple[float, VerifierStatus, str]:
    """Reward, status and (when not ok) why, from reward.txt or else reward.json beside it."""
    reward_json = reward_txt.with_name("reward.json")
    if reward_txt.is_file():
        text = reward_txt.read_text(errors="replace").strip()
        try:
            value = float(text)
        except ValueError:
            return 0.0, "bad_reward", f"{reward_txt.name} holds {text[:80]!r}, not a number"
    elif reward_json.is_file():
        try:
            data = json.loads(reward_json.read_text())
        except ValueError as e:
            return 0.0, "bad_reward", f"reward.json is not JSON: {e}"
        if not isinstance(data, dict) or ("reward" not in data and len(data) != 1):
            return 0.0, "bad_reward", "reward.json needs a 'reward' key or exactly one metric"
        value = data["reward"] if "reward" in data else next(iter(data.values()))
        if isinstance(value, bool) or not isinstance(value, int | float):
            return 0.0, "bad_reward", f"reward.json reward {value!r} is not a number"
    else:
        return 0.0, "no_reward", "the verifier wrote no reward.txt or reward.json"
    if not math.isfinite(value):
        return 0.0, "bad_reward", f"reward {value!r} is not finite"
    return float(value), "ok", ""


# Harbor's paths for the folders of _scratch_layout, used inside a sandbox.
_HARBOR = {"tests": "/tests", "solution": "/solution", "logs": "/logs"}


def _run_task_script(
    workspace: Path,
    paths: Mapping[str, Path],
    kind: str,
    task_env: Mapping[str, str],
    timeout: float,
    sandbox: SandboxConfig | None,
) -> ScriptResult:
    """``tests/test.sh`` or ``solution/solve.sh`` (``kind``), sandboxed with the Harbor paths when asked."""
    script = "test.sh" if kind == "tests" else "solve.sh"
    log = paths["home"].parent / "output.log"
    if sandbox is None or sandbox.mode == "none":
        env = _script_env(workspace, paths, task_env)
        return run_script(paths[kind] / script, workspace, env, timeout, log)
    inside = {**paths, kind: Path(_HARBOR[kind]), "logs": Path(_HARBOR["logs"])}
    env = _script_env(Path(sandbox.workdir), inside, task_env)
    mounts = [Mount(_HARBOR[kind], paths[kind]), Mount(_HARBOR["logs"], paths["logs"])]
    argv = ["bash", str(inside[kind] / script)]
    with sandboxed(sandbox, argv, workspace, paths["home"].parent / "sandbox", mounts=mounts) as prepared:
        prefix = prepared.argv[: -len(argv)]  # run_script adds `bash script` itself
        return run_script(inside[kind] / script, prepared.cwd, env, timeout, log, prefix=prefix)


def run_script(
    script: Path,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    log_path: Path,
    *,
    prefix: Sequence[str] = (),
) -> ScriptResult:
    """``bash script`` in its own process group, output to ``log_path``; the group is killed at timeout and at exit.

    ``prefix`` (e.g. a sandbox's command) goes before ``bash script``."""
    start = time.monotonic()
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [*prefix, "bash", str(script)],
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            timed_out = not _wait_unreaped(proc.pid, start + timeout_s)
        finally:
            # The leader is a zombie here, so its group id cannot have been reused: killing the group is safe.
            _kill_group(proc.pid)
            status = proc.wait()
    duration = time.monotonic() - start
    exit_status = None if timed_out else status
    tail = log_path.read_bytes()[-OUTPUT_TAIL_CHARS:].decode("utf-8", errors="replace")
    return ScriptResult(exit_status, timed_out, duration, tail)


def _wait_unreaped(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` exits (True) or ``deadline`` passes (False), leaving it unreaped (WNOWAIT)."""
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already gone: nothing left to clean up
        pass


def _scratch_layout(scratch: Path, source: Path, name: str) -> dict[str, Path]:
    """home/, tmp/, logs/verifier/ and a copy of the task's ``source`` folder as ``name``/ under ``scratch``."""
    paths = {"home": scratch / "home", "tmp": scratch / "tmp", "logs": scratch / "logs", name: scratch / name}
    for key in ("home", "tmp"):
        paths[key].mkdir()
    (paths["logs"] / "verifier").mkdir(parents=True)
    (paths["logs"] / "agent").mkdir()
    shutil.copytree(source, paths[name], symlinks=True)
    return paths


def _script_env(workspace: Path, paths: Mapping[str, Path], task_env: Mapping[str, str]) -> dict[str, str]:
    env = {k: os.environ[k] for k in _INHERITED if k in os.environ}
    env.setdefault("PATH", os.defpath)
    env.update(task_env)
    env.update(
        HOME=str(paths["home"]),
        TMPDIR=str(paths["tmp"]),
        LC_ALL="C.UTF-8",
        PYTHONDONTWRITEBYTECODE="1",
        TASK_WORKDIR=str(workspace.resolve()),
        LOGS_DIR=str(paths["logs"]),
        REWARD_FILE=str(paths["logs"] / "verifier" / "reward.txt"),
    )
    if "tests" in paths:
        env["TESTS_DIR"] = str(paths["tests"])
    if "solution" in paths:
        env["SOLUTION_DIR"] = str(paths["solution"])
    return env
