"""Configuration of a training run: TRL's ``GRPOConfig`` for the optimisation, :class:`RunConfig` for the rest.

Contract
--------
* The update is configured with TRL's own :class:`trl.GRPOConfig` (a ``TrainingArguments`` subclass: learning
  rate, epsilon/epsilon_high, loss_type, scale_rewards, num_generations, logging, report_to, save, bf16 ...), so
  users keep TRL's knobs, logging and checkpoint conventions. :func:`check_grpo_config` rejects the GRPOConfig
  settings this trainer does not honour (a generation backend, a KL reference model, loss types other than
  ``dapo``/``grpo``/``bnpo``, ...) with an error that names the field and the value to use instead.
* :class:`RunConfig` (frozen) holds what TRL has no field for: tasks, harnesses and their loss weights, the
  grouping of advantages, iterations, the engine, the staleness policy, the IS cap, auxiliary calls, the maximum
  sequence length. ``__post_init__`` validates with actionable messages. ``num_generations`` of the GRPOConfig is
  the group size G (rollouts per task and harness). ``engine_url`` is one vLLM URL or several, comma-separated
  (replicas of one model): :attr:`RunConfig.engine_urls` is the parsed tuple; ``tasks.collect`` gets the
  same comma-separated list, and the sync pushes every new policy to each of them.
* :func:`to_json` / :func:`run_config_from_json` write and read ``config.json`` of a run (the RunConfig plus the
  GRPOConfig's non-default values, for the record).

This module does not import torch or TRL at import time (mypy runs in the proxy env); TRL is imported by the
functions that need it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from addon.engine.pool import parse_engine_urls as _parse_urls

Grouping: TypeAlias = Literal["task", "task_harness"]
StalenessPolicy: TypeAlias = Literal["refuse", "is_correct"]
SUPPORTED_LOSS_TYPES = frozenset({"dapo", "grpo", "bnpo"})
SCALE_REWARDS = {"group": "group", "batch": "batch", "none": "none", True: "group", False: "none"}


class ConfigError(ValueError):
    """A setting this trainer cannot run with; the message says what to change."""


@dataclass(frozen=True)
class RunConfig:
    """Everything of a run that TRL's GRPOConfig has no field for."""

    tasks: str = "smoke"  # a built-in subset or a task folder (tasks.collect --tasks)
    harnesses: tuple[str, ...] = ("mini-swe-agent",)
    # loss weight per harness (multiplies each sample's loss); harnesses not named weigh 1.0
    harness_weights: Mapping[str, float] = field(default_factory=dict)
    grouping: Grouping = "task"  # advantages over the G rollouts of a task across harnesses, or per task x harness
    iterations: int = 2
    run_dir: Path = Path("runs/train/run")
    model: str = "default"  # 'default', a local model folder or a hub id (trainer.model resolves it)
    cache_dir: Path = Path(".cache/harnessrl")
    # one URL, or several comma-separated vLLM replicas; None: start one engine (trainer/engine.py), stop it at the end
    engine_url: str | None = None
    staleness: StalenessPolicy = "is_correct"
    max_staleness: int = 1  # is_correct: samples more than this many versions old are dropped
    is_cap: float | None = None  # truncates the IS ratio pi_theta / pi_behaviour from above (None: no cap)
    include_auxiliary: bool = False
    max_length: int = 8192  # sequences longer than this are dropped (and counted), never silently cut
    reward: str = "pass_fail"  # tasks.collect --reward
    collect_timeout: float | None = None  # per-rollout seconds (None: the harness's own)
    collect_concurrency: int = 2
    max_tasks: int = 0  # 0: every task of the subset
    seed: int = 0
    # seeds each collect (tasks.collect --seed): a call's seed hashes it with the session and call index, so the G
    # rollouts of a task still differ; two runs with the same value and run-dir name sample their first iteration
    # alike (the learning benchmark's treatment and control). None: unseeded.
    collect_seed: int | None = None
    proxy_python: Path = Path(".venvs/proxy/bin/python")

    def __post_init__(self) -> None:
        object.__setattr__(self, "harness_weights", MappingProxyType(dict(self.harness_weights)))
        object.__setattr__(self, "run_dir", Path(self.run_dir))
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        object.__setattr__(self, "proxy_python", Path(self.proxy_python))
        object.__setattr__(self, "harnesses", tuple(self.harnesses))
        if not self.harnesses:
            raise ConfigError("harnesses: name at least one harness (e.g. 'mini-swe-agent')")
        unknown = sorted(set(self.harness_weights) - set(self.harnesses))
        if unknown:
            raise ConfigError(f"harness_weights names {unknown}, which are not in harnesses {list(self.harnesses)}")
        if any(w < 0 for w in self.harness_weights.values()):
            raise ConfigError(f"harness_weights must be >= 0, got {dict(self.harness_weights)}")
        if self.grouping not in ("task", "task_harness"):
            raise ConfigError(f"grouping must be 'task' or 'task_harness', got {self.grouping!r}")
        if self.staleness not in ("refuse", "is_correct"):
            raise ConfigError(f"staleness must be 'refuse' or 'is_correct', got {self.staleness!r}")
        if self.iterations < 1:
            raise ConfigError(f"iterations must be >= 1, got {self.iterations}")
        if self.max_staleness < 0:
            raise ConfigError(f"max_staleness must be >= 0, got {self.max_staleness}")
        if self.is_cap is not None and self.is_cap <= 1.0:
            raise ConfigError(f"is_cap must be > 1 (it truncates ratios above it) or None, got {self.is_cap}")
        if self.max_length < 2:
            raise ConfigError(f"max_length must be >= 2, got {self.max_length}")
        if self.collect_concurrency < 1:
            raise ConfigError(f"collect_concurrency must be >= 1, got {self.collect_concurrency}")
        if self.engine_url is not None:
            parse_engine_urls(self.engine_url)

    @property
    def engine_urls(self) -> tuple[str, ...]:
        """The engines of ``engine_url`` (empty when the run starts its own)."""
        return parse_engine_urls(self.engine_url) if self.engine_url is not None else ()

    def harness_weight(self, harness: str) -> float:
        return float(self.harness_weights.get(harness, 1.0))


def parse_engine_urls(text: str) -> tuple[str, ...]:
    """``"http://a:8000, http://b:8000/"`` -> ``("http://a:8000", "http://b:8000")``: the proxy's own rules
    (:func:`addon.engine.pool.parse_engine_urls`), so the trainer and ``tasks.collect`` accept the same lists."""
    try:
        return _parse_urls(text)
    except ValueError as e:
        raise ConfigError(f"engine_url {text!r}: {e}") from e


def scale_rewards_mode(value: object) -> str:
    """GRPOConfig.scale_rewards as one of 'group', 'batch', 'none'."""
    key = value if isinstance(value, bool) else str(value)
    if key not in SCALE_REWARDS:
        raise ConfigError(f"scale_rewards must be 'group', 'batch' or 'none', got {value!r}")
    return SCALE_REWARDS[key]


def check_grpo_config(args: Any) -> None:
    """Reject the GRPOConfig settings this trainer does not honour (see the module docstring)."""
    problems: list[str] = []
    if args.loss_type not in SUPPORTED_LOSS_TYPES:
        problems.append(f"loss_type={args.loss_type!r}: use one of {sorted(SUPPORTED_LOSS_TYPES)}")
    if args.use_vllm:
        problems.append("use_vllm=True: generation happens in the collect phase through the proxy; set use_vllm=False")
    if args.beta != 0.0:
        problems.append(f"beta={args.beta}: no KL reference model is kept here; set beta=0.0")
    if getattr(args, "importance_sampling_level", "token") != "token":
        problems.append("importance_sampling_level: only 'token' is implemented")
    if getattr(args, "top_entropy_quantile", 1.0) != 1.0:
        problems.append("top_entropy_quantile: only 1.0 (all tokens) is implemented")
    if getattr(args, "delta", None) is not None:
        problems.append("delta (two-sided clipping): not implemented; leave it None")
    if getattr(args, "use_liger_kernel", False):
        problems.append("use_liger_kernel=True: the loss is computed here; set it False")
    if getattr(args, "sync_ref_model", False):
        problems.append("sync_ref_model=True: there is no reference model; set it False")
    if args.num_generations is None or args.num_generations < 2:
        problems.append(f"num_generations={args.num_generations}: a group needs >= 2 rollouts")
    if args.remove_unused_columns:
        problems.append("remove_unused_columns=True: the loss needs every column; set it False")
    if args.epsilon <= 0 or (args.epsilon_high is not None and args.epsilon_high <= 0):
        problems.append("epsilon and epsilon_high must be > 0")
    scale_rewards_mode(args.scale_rewards)
    if problems:
        raise ConfigError("unsupported GRPOConfig settings:\n  " + "\n  ".join(problems))


def default_grpo_config(output_dir: Path, **overrides: Any) -> Any:
    """A GRPOConfig with this trainer's defaults (CPU-friendly; bf16 only on CUDA), ``overrides`` on top."""
    import torch
    from trl import GRPOConfig

    cuda = torch.cuda.is_available()
    values: dict[str, Any] = {
        "output_dir": str(output_dir),
        "bf16": cuda,
        "use_cpu": not cuda,
        "learning_rate": 1e-5,
        "lr_scheduler_type": "constant",
        "num_generations": 4,
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 8,
        "gradient_checkpointing": False,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "optim": "adamw_torch",
        "num_train_epochs": 1,
        "disable_tqdm": False,
        # Under `accelerate launch` the other ranks wait in a barrier while rank 0 collects, and a collect phase
        # can take hours; the process group's default timeout (30 min) would abort them. A crashed rank still ends
        # the job at once (the launcher stops the others).
        "ddp_timeout": 24 * 3600,
    }
    values.update(overrides)
    if values.get("generation_batch_size") is None and values.get("steps_per_generation") is None:
        # Unused here (the collect phase decides how many rollouts there are), but GRPOConfig insists that it
        # divides into whole groups and whole global batches: the least common multiple satisfies both.
        world = int(os.environ.get("WORLD_SIZE", "1"))
        values["generation_batch_size"] = math.lcm(values["per_device_train_batch_size"] * world,
                                                   values["num_generations"])  # fmt: skip
    args = GRPOConfig(**values)
    check_grpo_config(args)
    return args


def to_json(run: RunConfig, args: Any | None = None) -> str:
    """``config.json`` of a run: the RunConfig, and the GRPOConfig's values when given."""
    body: dict[str, Any] = {}
    for f in dataclasses.fields(run):
        value = getattr(run, f.name)
        if isinstance(value, Path):
            value = str(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        body[f.name] = value
    out: dict[str, Any] = {"run": body}
    if args is not None:
        out["grpo"] = json.loads(args.to_json_string())
    return json.dumps(out, indent=2, sort_keys=True)


def run_config_from_json(text: str) -> RunConfig:
    """The RunConfig of a ``config.json``; unknown keys are an error (they would be silently ignored otherwise)."""
    body = json.loads(text)["run"]
    names = {f.name for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(body) - names)
    if unknown:
        raise ConfigError(f"config.json: unknown run settings {unknown}")
    if "harnesses" in body:
        body["harnesses"] = tuple(body["harnesses"])
    return RunConfig(**body)
