"""CLI of a training run: ``python -m trainer.train`` (what ``make train`` runs).

Contract
--------
* Flags map onto :class:`trainer.config.RunConfig` (tasks, harnesses, weights, grouping, iterations, engine,
  staleness ...) and onto TRL's ``GRPOConfig`` (``--group-size`` is ``num_generations``; ``--learning-rate``,
  ``--loss-type``, ``--epsilon``, ``--epsilon-high``, ``--scale-rewards``, ``--batch-size``, ``--grad-accum``,
  ``--epochs``, ``--report-to``, ``--save-total-limit``), and any other GRPOConfig field passes through
  ``--grpo NAME=VALUE`` (VALUE parsed as JSON when it parses, else taken as a string). A name GRPOConfig does not
  have, or a setting this trainer does not honour, exits with status 2 and a message saying what to change.
* ``--report-to`` (``$REPORT_TO``; :func:`trainer.tracking.resolve_report_to`): ``auto`` (default) is trackio when
  installed, else none; or ``trackio``, ``wandb``, ``tensorboard`` (comma-separated), or ``none``. An unknown name
  exits with status 2 saying what to write. ``run_name`` defaults to the run folder's name and ``project`` to
  ``harnessrl`` (``--grpo run_name=...``/``--grpo project=...``), so per-step and per-iteration logs share one run.
* Environment defaults (``make train``): TASKS, HARNESSES, GROUP_SIZE, ITERATIONS, ENGINE_URL, RUN_ID, REPORT_TO.
  ``--engine-url`` takes one URL or several comma-separated (vLLM replicas; each is synced every iteration).
* Runs the same under ``accelerate launch --num_processes N -m trainer.train ...`` (DDP; rank 0 collects and
  syncs, every rank trains: trainer/loop.py).
* ``--run-dir`` defaults to ``runs/train/<run-id>``; running again with the same folder resumes after its last
  completed iteration (``state.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, RunConfig, default_grpo_config
from trainer.tracking import resolve_report_to


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default


def parse_weights(text: str) -> dict[str, float]:
    """``"pi=2,mini-swe-agent=1"`` -> ``{"pi": 2.0, "mini-swe-agent": 1.0}``."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise ConfigError(f"--harness-weights: {part!r} is not NAME=WEIGHT")
        try:
            out[name.strip()] = float(value)
        except ValueError as e:
            raise ConfigError(f"--harness-weights: {value!r} is not a number") from e
    return out


def parse_grpo_overrides(items: Sequence[str]) -> dict[str, Any]:
    from trl import GRPOConfig

    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    out: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--grpo {item!r}: expected NAME=VALUE")
        if name not in known:
            raise ConfigError(f"--grpo {name}: GRPOConfig has no such field")
        try:
            out[name] = json.loads(raw)
        except ValueError:
            out[name] = raw
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.train", description=__doc__.split("\n")[0])
    r = p.add_argument_group("run")
    r.add_argument("--tasks", default=_env("TASKS", "smoke"), help="built-in subset or task folder ($TASKS)")
    r.add_argument("--harnesses", default=_env("HARNESSES", "mini-swe-agent"), help="comma-separated ($HARNESSES)")
    r.add_argument("--harness-weights", default="", help="loss weight per harness: NAME=W,... (others 1)")
    r.add_argument("--grouping", choices=("task", "task_harness"), default="task")
    r.add_argument("--iterations", type=int, default=int(_env("ITERATIONS", "2")), help="($ITERATIONS)")
    r.add_argument("--run-dir", type=Path, default=None, help="default runs/train/<run-id>; an existing one resumes")
    r.add_argument("--run-id", default=_env("RUN_ID", ""), help="default: a timestamp ($RUN_ID)")
    r.add_argument("--model", default="default")
    r.add_argument("--cache-dir", type=Path, default=Path(".cache/harnessrl"))
    r.add_argument(
        "--engine-url", default=_env("ENGINE_URL", ""), help="URL(s), comma-separated; empty: start one ($ENGINE_URL)"
    )
    r.add_argument("--staleness", choices=("refuse", "is_correct"), default="is_correct")
    r.add_argument("--max-staleness", type=int, default=1)
    r.add_argument("--is-cap", type=float, default=None, help="truncate the IS ratio above this (> 1)")
    r.add_argument("--include-auxiliary", action="store_true")
    r.add_argument("--max-length", type=int, default=8192)
    r.add_argument("--reward", default="pass_fail")
    r.add_argument("--collect-timeout", type=float, default=None)
    r.add_argument("--concurrency", type=int, default=2)
    r.add_argument("--max-tasks", type=int, default=0)
    r.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("GRPOConfig (TRL)")
    g.add_argument("--group-size", "-G", type=int, default=int(_env("GROUP_SIZE", "4")), help="num_generations")
    g.add_argument("--learning-rate", type=float, default=1e-5)
    g.add_argument("--loss-type", default="dapo")
    g.add_argument("--epsilon", type=float, default=0.2)
    g.add_argument("--epsilon-high", type=float, default=None)
    g.add_argument("--scale-rewards", default="group")
    g.add_argument("--batch-size", type=int, default=1, help="per_device_train_batch_size")
    g.add_argument("--grad-accum", type=int, default=8, help="gradient_accumulation_steps")
    g.add_argument("--epochs", type=float, default=1.0, help="num_train_epochs over each iteration's samples")
    g.add_argument(
        "--report-to",
        default=_env("REPORT_TO", "auto"),
        help="trackio, wandb, tensorboard (comma-separated), auto (trackio when installed) or none ($REPORT_TO)",
    )
    g.add_argument("--save-total-limit", type=int, default=None, help="keep this many checkpoints")
    g.add_argument("--grpo", action="append", default=[], metavar="NAME=VALUE", help="any other GRPOConfig field")
    return p


def configs(ns: argparse.Namespace) -> tuple[RunConfig, Any]:
    run_id = ns.run_id or time.strftime("%Y%m%d-%H%M%S")
    run_dir = ns.run_dir or Path("runs/train") / run_id
    run = RunConfig(
        tasks=ns.tasks,
        harnesses=tuple(h.strip() for h in ns.harnesses.split(",") if h.strip()),
        harness_weights=parse_weights(ns.harness_weights),
        grouping=ns.grouping,
        iterations=ns.iterations,
        run_dir=run_dir,
        model=ns.model,
        cache_dir=ns.cache_dir,
        engine_url=ns.engine_url or None,
        staleness=ns.staleness,
        max_staleness=ns.max_staleness,
        is_cap=ns.is_cap,
        include_auxiliary=ns.include_auxiliary,
        max_length=ns.max_length,
        reward=ns.reward,
        collect_timeout=ns.collect_timeout,
        collect_concurrency=ns.concurrency,
        max_tasks=ns.max_tasks,
        seed=ns.seed,
    )
    report_to = resolve_report_to(ns.report_to)
    overrides: dict[str, Any] = {
        "num_generations": ns.group_size,
        "learning_rate": ns.learning_rate,
        "loss_type": ns.loss_type,
        "epsilon": ns.epsilon,
        "epsilon_high": ns.epsilon_high,
        "scale_rewards": ns.scale_rewards,
        "per_device_train_batch_size": ns.batch_size,
        "gradient_accumulation_steps": ns.grad_accum,
        "num_train_epochs": ns.epochs,
        "report_to": report_to,
        "save_total_limit": ns.save_total_limit,
        "seed": ns.seed,
        "run_name": run_dir.name,  # transformers' per-step logs and trainer.tracking's per-iteration rows: one run
        "project": "harnessrl",
    }
    overrides |= parse_grpo_overrides(ns.grpo)
    return run, default_grpo_config(run_dir / "trainer", **overrides)


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        run, args = configs(ns)
    except (ConfigError, ValueError) as e:  # GRPOConfig's own checks raise ValueError
        print(f"trainer.train: {e}", file=sys.stderr)
        return 2
    from trainer.loop import train_run

    try:
        state = train_run(run, args)
    except ConfigError as e:  # found once the trainer exists (e.g. a DeepSpeed launch)
        print(f"trainer.train: {e}", file=sys.stderr)
        return 2
    from accelerate import PartialState

    if PartialState().is_main_process:
        print(json.dumps({"run_dir": str(run.run_dir), **dataclasses.asdict(state)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
