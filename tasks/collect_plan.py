"""What a collection run will do: its validated settings (:class:`CollectConfig`) and the rollouts they expand to.

Contract
--------
* :class:`CollectConfig` is everything a run needs. ``__post_init__`` validates it with actionable errors
  (:class:`CollectConfigError`): known harnesses, listed once (``("all",)`` expands to every registered harness, in
  registry order), counts in range, a run id usable in a session id, parseable engine URLs (without any, an
  existing engine-env Python), a loadable reward, a known ``route`` and, in ``namespaces`` mode, a working sandbox
  (:func:`tasks.sandbox.check_available`, a ~20 ms probe). ``run_dir`` defaults to ``runs/collect/<run_id>``.
* :func:`load_tasks` resolves ``tasks`` (a task folder, a folder of tasks, or a built-in subset name), first
  ``max_tasks`` only; an unknown name raises :class:`CollectConfigError` naming what is known.
* :func:`plan` expands config x tasks into :class:`Rollout` s: session id ``<run>-<task>-<harness>-<g>``, group id
  ``<task>/<harness>``; sample-major, one harness's tasks in a row (prefix-cache reuse), shuffled when a seed is
  given.

Nothing here starts a service or writes a file; :mod:`tasks.collect` runs the plan, and every public name
here is importable from it too.

Layout: defaults, config, plan.
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

from addon.engine.pool import parse_engine_urls
from tasks.harnesses import HARNESSES, HarnessSpec
from tasks.rewards import RewardConfig, RewardConfigError, Rewarder, StopReward
from tasks.sandbox import SandboxConfig, SandboxError, check_available
from tasks.taskset import Task, TaskFormatError, TaskSet, builtin_taskset, load_taskset

ROOT = Path(__file__).resolve().parent.parent
ENGINE_PYTHON = ROOT / ".venvs" / "engine" / "bin" / "python"
# The two cheapest on a CPU engine: the smallest first prompts (~1-2k tokens; the others' are 7-19k, which fit the
# engine's 32k context but cost minutes of cold prefill each). ``all`` selects every registered harness.
DEFAULT_HARNESSES = ("pi", "mini-swe-agent")
ALL_HARNESSES = "all"
Route = Literal["proxy", "base-url"]
ROUTES: tuple[str, ...] = get_args(Route)


class CollectConfigError(ValueError):
    """A collection setting that cannot work; the message says what to change."""


def _new_run_id() -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class CollectConfig:
    tasks: str = "smoke"
    """A task folder, a folder of tasks, or a built-in subset name (``smoke``, ``easy``, a tag, ``all``)."""
    harnesses: tuple[str, ...] = DEFAULT_HARNESSES
    """Harness names; ``("all",)`` expands to every registered harness (``HARNESSES``), in registry order."""
    group_size: int = 2
    """Rollouts per (task, harness) group."""
    concurrency: int = 2
    """Rollouts running at once (2 suits a CPU engine)."""
    timeout_s: float | None = None
    """Per-rollout harness limit; None: the task's agent timeout, raised to the harness's own limit when that is
    longer (see :func:`rollout_timeout`)."""
    max_tasks: int = 0
    """Use only the first N tasks of the selection (0: all)."""
    run_id: str = field(default_factory=_new_run_id)
    run_dir: Path | None = None
    """Default: runs/collect/<run_id>."""
    engine_url: str = ""
    """A running engine to use; empty: reuse the one recorded in engine_run_dir, or start one."""
    engine_python: Path = ENGINE_PYTHON
    engine_run_dir: Path = Path("runs/engine")
    model: str = "default"
    """Model the engine is started with (ignored when an engine is reused)."""
    cache_dir: Path = Path(".cache/harnessrl")
    reward: str = "pass_fail"
    """pass_fail, fractional, tool_shaping, or module:function."""
    on_budget_stop: StopReward = 0.0
    on_crash: StopReward = 0.0
    max_calls: int = 8
    """Model calls per episode (the proxy's harnessrl_max_calls); 0: no cap."""
    seed: int | None = None
    """Shuffles the rollout order and seeds sampling of calls that give no seed (None: unseeded)."""
    temperature: float | None = None
    """Sample every call at this temperature (the proxy's ``harnessrl_temperature``); None: the temperature the
    harness asks for, else 1.0. The records say what was applied and the trainer scales its logits to match."""
    keep_workspaces: bool = False
    route: Route = "proxy"
    """How harnesses reach the proxy: ``proxy`` (``HTTPS_PROXY``, as a user configures them); ``base-url``: the
    harnesses that take a base URL from their environment (:meth:`HarnessSpec.base_url_env`) call the internal server
    straight, skipping mitmproxy's hop, and the others still use ``HTTPS_PROXY``."""
    sandbox: SandboxConfig = SandboxConfig()
    """Where harnesses and verifiers run; mode "none" opts out of the namespaces sandbox (limits still apply)."""

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise CollectConfigError(f"route must be one of {', '.join(ROUTES)}, got {self.route!r}")
        if self.temperature is not None and not 0 < self.temperature <= 2:
            raise CollectConfigError(f"temperature must be in (0, 2], got {self.temperature}")
        if not self.tasks:
            raise CollectConfigError("tasks is empty: give a task folder or a built-in subset such as 'smoke'")
        if not self.harnesses:
            raise CollectConfigError(f"no harness selected; known: {', '.join(HARNESSES)} (or {ALL_HARNESSES})")
        if ALL_HARNESSES in self.harnesses:
            if len(self.harnesses) > 1:
                raise CollectConfigError(f"'{ALL_HARNESSES}' already names every harness; list it alone")
            object.__setattr__(self, "harnesses", tuple(HARNESSES))
        unknown = [h for h in self.harnesses if h not in HARNESSES]
        if unknown:
            raise CollectConfigError(f"unknown harness(es) {', '.join(unknown)}; known: {', '.join(HARNESSES)}")
        if len(set(self.harnesses)) != len(self.harnesses):
            raise CollectConfigError(f"harnesses listed twice: {', '.join(self.harnesses)}")
        for name in ("group_size", "concurrency"):
            if getattr(self, name) < 1:
                raise CollectConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("max_tasks", "max_calls"):
            if getattr(self, name) < 0:
                raise CollectConfigError(f"{name} must be >= 0 (0: no limit), got {getattr(self, name)}")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise CollectConfigError(f"timeout_s must be a positive number of seconds, got {self.timeout_s}")
        if not self.run_id or any(c in self.run_id for c in ":@/ "):
            raise CollectConfigError(f"run_id {self.run_id!r} must be non-empty, without ':', '@', '/' or spaces")
        if self.engine_url:
            try:
                parse_engine_urls(self.engine_url)
            except ValueError as e:
                raise CollectConfigError(f"engine_url: {e}") from e
        if not self.engine_url and not self.engine_python.exists():
            raise CollectConfigError(
                f"no engine_url and the engine env's python {self.engine_python} does not exist: "
                "run `make engine-env`, pass --engine-python, or point --engine-url at a running engine"
            )
        try:
            self.rewarder()
            if self.sandbox.mode == "namespaces":
                check_available()
        except (RewardConfigError, SandboxError) as e:
            raise CollectConfigError(str(e)) from e
        if self.run_dir is None:
            object.__setattr__(self, "run_dir", Path("runs/collect") / self.run_id)

    @property
    def out(self) -> Path:
        assert self.run_dir is not None  # set in __post_init__
        return self.run_dir

    def rewarder(self) -> Rewarder:
        return Rewarder.from_config(RewardConfig(self.reward, self.on_budget_stop, self.on_crash))


# ------------------------------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class Rollout:
    task: Task
    spec: HarnessSpec
    sample_index: int
    session_id: str

    @property
    def group_id(self) -> str:
        return f"{self.task.id}/{self.spec.name}"


def load_tasks(spec: str, max_tasks: int = 0) -> TaskSet:
    """A path (task or folder of tasks) when one exists, else a built-in subset; errors name what is known."""
    try:
        chosen = load_taskset(spec) if Path(spec).exists() else builtin_taskset(spec)
    except (KeyError, TaskFormatError) as e:
        raise CollectConfigError(f"tasks {spec!r}: {e.args[0]}") from e
    return TaskSet(chosen.name, chosen.tasks[:max_tasks]) if max_tasks else chosen


def uses_base_url(config: CollectConfig, spec: HarnessSpec) -> bool:
    """Whether ``spec``'s rollouts call the internal server's base URL (``route="base-url"`` and it takes one)."""
    return config.route == "base-url" and spec.base_url_env("http://127.0.0.1:1/s/probe") is not None


def plan(config: CollectConfig, tasks: TaskSet) -> list[Rollout]:
    """Sample-major order (every group gets its first sample early), and within a sample one harness's tasks one
    after another, so that the engine's prefix cache still holds that harness's system prompt and tools (7-19k
    tokens) when its next rollout starts; shuffled when a seed is given."""
    rollouts = [
        Rollout(task, HARNESSES[h], g, f"{config.run_id}-{task.id}-{h}-{g}")
        for g in range(config.group_size)
        for h in config.harnesses
        for task in tasks
    ]
    if config.seed is not None:
        random.Random(config.seed).shuffle(rollouts)
    return rollouts
