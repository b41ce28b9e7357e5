"""The training loop: collect -> samples -> train -> checkpoint -> sync, for N iterations, resumable.

Contract
--------
* :func:`train_run` runs iterations ``state.iteration + 1 .. run.iterations`` in ``run.run_dir`` (layout in
  docs/training.md). Before the first, every engine is made to serve the weights the trainer starts from (the base
  model, or the last checkpoint of ``state.json`` when resuming) under their policy version (0 for the base), so
  every record of the next collect carries a version the trainer knows.
* Per iteration: *collect* runs ``tasks.collect`` in the proxy env as a subprocess (G = ``num_generations``
  rollouts per task and harness, on the engines' current weights, all engine URLs passed comma-separated; it
  prints its own progress), then :func:`trainer.samples.build_samples` against the current version; *train* runs
  ``Trainer.train()`` on those samples (the same trainer object every iteration: the optimizer state carries over;
  a Trainer restarts its step count per ``train()``, so the metrics rows add an offset); *checkpoint* saves model,
  tokenizer and optimizer; *sync* pushes the checkpoint to every engine as version = iteration; then
  ``state.json`` is written (tmp + rename), so an interrupted run resumes after the last completed iteration. An
  iteration without samples (every group had equal rewards) skips the update but still checkpoints and syncs, so
  versions stay aligned with iterations.
* Several processes (``accelerate launch --num_processes N``; ranks from ``accelerate.PartialState``): only the
  main process starts/reuses the engines, collects, syncs and writes the run's files (config.json, metrics.jsonl,
  checkpoints, state.json). After a barrier every rank builds the samples from the same collect folder (so
  ``run_dir`` must be on storage every rank sees) and trains on its shard of them (DDP); every rank takes part in
  the checkpoint save; a barrier ends each iteration, so no rank runs ahead of the state file. DeepSpeed and FSDP
  are refused (:func:`check_parallelism`).
* Metrics rows (``collect``, ``train`` via :class:`~trainer.grpo.MetricsFileCallback`, ``sync``) go to
  ``metrics.jsonl``, and (main process) to the ``report_to`` backends through :class:`~trainer.tracking.Tracker`:
  ``collect/*`` and ``sync/*`` per iteration, ``update/*`` (the iteration's optimizer steps summed up) after each
  ``train()``; transformers' own callbacks log every step. The collect row carries the samples' staleness.
* The engines: ``run.engine_url`` (one URL or several) is reused; otherwise one engine is started
  (trainer/engine.py) in ``run_dir/engine`` and stopped at the end.
* :class:`Phases` holds the three steps that reach outside the process (start/find the engines, collect, push the
  weights); ``train_run`` uses the real ones unless given others (the multi-process test runs the loop without an
  engine or a harness). ``train_run(callbacks=...)`` adds ``TrainerCallback`` objects to the trainer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from addon.records.schema import read_records, records_from_table
from tasks.episodes import EpisodeRecord, read_episodes
from trainer import sync
from trainer.config import ConfigError, RunConfig, check_grpo_config, scale_rewards_mode, to_json
from trainer.samples import SampleOptions, SampleSet, build_samples, collect_metrics, staleness_metrics
from trainer.tracking import Tracker

REPO = Path(__file__).resolve().parents[1]
STATE_FILE = "state.json"
METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class RunState:
    iteration: int  # the last completed iteration (0: none)
    policy_version: int
    checkpoint: str  # the folder the engine serves and the trainer resumes from

    def write(self, run_dir: Path) -> None:
        tmp = run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, run_dir / STATE_FILE)

    @classmethod
    def read(cls, run_dir: Path) -> RunState | None:
        path = run_dir / STATE_FILE
        if not path.exists():
            return None
        body = json.loads(path.read_text())
        return cls(int(body["iteration"]), int(body["policy_version"]), str(body["checkpoint"]))


def say(message: str) -> None:
    """A progress line on stderr, from the main process only (under ``accelerate launch`` every rank runs this)."""
    from accelerate import PartialState

    if PartialState().is_main_process:
        print(f"[train] {message}", file=sys.stderr, flush=True)


def collect_command(run: RunConfig, group_size: int, url: str, out: Path, iteration: int) -> list[str]:
    """The ``tasks.collect`` command line; ``--seed`` only with ``run.collect_seed`` (the proxy hashes it with each
    call's session and index, so the G rollouts of a task still differ)."""
    cmd = [
        str(run.proxy_python),
        "-m",
        "tasks.collect",
        "--tasks",
        run.tasks,
        "--harnesses",
        ",".join(run.harnesses),
        "--group-size",
        str(group_size),
        "--engine-url",
        url,
        "--run-dir",
        str(out),
        "--run-id",
        f"{run.run_dir.name}-iter-{iteration:04d}",
        "--reward",
        run.reward,
        "--concurrency",
        str(run.collect_concurrency),
        "--max-tasks",
        str(run.max_tasks),
    ]
    if run.collect_timeout is not None:
        cmd += ["--timeout", str(run.collect_timeout)]
    if run.collect_seed is not None:
        cmd += ["--seed", str(run.collect_seed)]
    return cmd


def collect(run: RunConfig, group_size: int, url: str, out: Path, iteration: int) -> None:
    """One collect phase in the proxy env; a half-written folder from an interrupted run is started over."""
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = collect_command(run, group_size, url, out, iteration)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, cwd=REPO, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"collect failed with exit status {done.returncode}: {' '.join(cmd)}")


def load_samples(run: RunConfig, args: Any, out: Path, version: int) -> tuple[SampleSet, list[EpisodeRecord]]:
    """The samples of a collect folder against policy ``version``, and its episodes."""
    episodes = read_episodes(out / "episodes.parquet")
    records_dir = out / "records"
    has_shards = records_dir.exists() and any(records_dir.rglob("*.parquet"))
    records = records_from_table(read_records(records_dir)) if has_shards else []
    opts = SampleOptions(
        grouping=run.grouping,
        scale_rewards=scale_rewards_mode(args.scale_rewards),  # type: ignore[arg-type]
        harness_weights=run.harness_weights,
        include_auxiliary=run.include_auxiliary,
        staleness=run.staleness,
        max_staleness=run.max_staleness,
        current_version=version,
        max_length=run.max_length,
    )
    return build_samples(episodes, records, opts), episodes


def start_engine(run: RunConfig) -> tuple[tuple[str, ...], bool]:
    """The engine URLs and whether this run started the (single) engine, and so stops it."""
    from trainer.engine import EngineConfig, ensure_engine
    from trainer.model import resolve_model

    engine_dir = run.run_dir / "engine"
    if run.engine_urls:
        # every replica must be up before the first sync; ensure_engine names the one that is not
        return tuple(ensure_engine(engine_dir, url)[0] for url in run.engine_urls), False
    model = resolve_model(run.model, run.cache_dir)
    url, state = ensure_engine(engine_dir, None, EngineConfig.for_model(model, engine_dir, port=0))
    return (url,), state is not None


def build_trainer(run: RunConfig, args: Any, start_from: str, metrics: Any, callbacks: Sequence[Any] = ()) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.grpo import CapturedGRPOTrainer, LossSettings

    model = AutoModelForCausalLM.from_pretrained(start_from, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(start_from)
    eps_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    settings = LossSettings(args.epsilon, eps_high, run.is_cap, args.loss_type)
    trainer = CapturedGRPOTrainer(
        model=model, args=args, processing_class=tokenizer, callbacks=[metrics, *callbacks], loss_settings=settings
    )
    check_parallelism(trainer)
    return trainer


def check_parallelism(trainer: Any) -> None:
    """Refuse sharded training (DeepSpeed, FSDP): the loop keeps one optimizer across iterations and saves it whole.

    transformers re-creates the DeepSpeed optimizer on every ``train()`` (``deepspeed_init`` resets it), which would
    silently drop the Adam state each iteration, and a sharded optimizer's state is not what ``save_checkpoint``
    writes. DDP (``accelerate launch`` without a DeepSpeed/FSDP config) is what this loop supports.
    """
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        kind = "DeepSpeed" if trainer.is_deepspeed_enabled else "FSDP"
        raise ConfigError(
            f"{kind} is not supported by the training loop (its optimizer state would be reset every iteration): "
            "launch with plain DDP (`accelerate launch --num_processes N`, no deepspeed/fsdp config); "
            "see docs/training.md, Scale"
        )


@dataclass(frozen=True)
class Phases:
    """What rank 0 does outside this process: find or start the engines, collect, push weights. The defaults are the
    real ones; tests of the training side pass their own (no engine, no harness) and keep the rest of the loop."""

    start_engines: Callable[[RunConfig], tuple[tuple[str, ...], bool]] = start_engine
    run_collect: Callable[[RunConfig, int, str, Path, int], None] = collect
    push_weights: Callable[[Sequence[str], Path, int], sync.SyncResult] = sync.sync_weights


def train_run(run: RunConfig, args: Any, phases: Phases | None = None, callbacks: Sequence[Any] = ()) -> RunState:
    """Run (or resume) the training run; returns the final state. See the module docstring. ``callbacks`` are
    further ``transformers.TrainerCallback`` objects for the trainer (they run on every rank)."""
    from accelerate import PartialState

    from trainer.grpo import MetricsFileCallback
    from trainer.model import resolve_model

    check_grpo_config(args)
    ranks = PartialState()  # the process group GRPOConfig set up (one process: a trivial one)
    if ranks.is_main_process:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        (run.run_dir / "config.json").write_text(to_json(run, args))
    metrics_path = run.run_dir / METRICS_FILE
    # every rank reads the same state file: rank 0 wrote it at the end of the last completed iteration
    state = RunState.read(run.run_dir) or RunState(0, 0, resolve_model(run.model, run.cache_dir))
    if state.iteration >= run.iterations:
        say(f"{run.run_dir} already completed {state.iteration} of {run.iterations} iterations")
        return state
    phases = phases or Phases()
    urls: tuple[str, ...] = ()
    started = False
    tracker = Tracker.for_args(args, run.run_dir, enabled=ranks.is_main_process)
    try:
        if ranks.is_main_process:
            urls, started = phases.start_engines(run)
            result = phases.push_weights(urls, Path(state.checkpoint), state.policy_version)
            say(
                f"{len(urls)} engine(s) serve {state.checkpoint} as policy version {state.policy_version} "
                f"({result.seconds:.2f} s)"
            )
        callback = MetricsFileCallback(metrics_path, on_row=tracker.log_row)
        trainer = build_trainer(run, args, state.checkpoint, callback, callbacks)
        if state.iteration and sync.load_optimizer_state(trainer, Path(state.checkpoint)):
            say(f"resumed after iteration {state.iteration} with its optimizer state")
        steps = 0
        for it in range(state.iteration + 1, run.iterations + 1):
            state, steps = iteration(run, args, urls, trainer, callback, state, it, steps, phases, tracker)
    finally:
        tracker.close()
        if started:
            from trainer.engine import stop

            stop(run.run_dir / "engine")
    return state


def iteration(
    run: RunConfig,
    args: Any,
    urls: Sequence[str],
    trainer: Any,
    callback: Any,
    state: RunState,
    it: int,
    steps: int,
    phases: Phases | None = None,
    tracker: Tracker | None = None,
) -> tuple[RunState, int]:
    """One collect -> train -> checkpoint -> sync round; returns the new state and the optimizer steps so far.

    Rank 0 collects, syncs and writes the state; every rank trains. ``urls`` is empty on the other ranks.
    ``tracker`` (rank 0's) gets the iteration's rows.
    """
    from accelerate import PartialState

    ranks = PartialState()
    phases = phases or Phases()
    version = state.policy_version
    out = run.run_dir / f"iter-{it:04d}" / "collect"
    collect_s = 0.0
    if ranks.is_main_process:
        say(f"iteration {it}/{run.iterations}: collect on policy version {version}")
        t0 = time.monotonic()
        phases.run_collect(run, args.num_generations, ",".join(urls), out, it)
        collect_s = time.monotonic() - t0
    # the collect folder is complete before any rank reads it (a failed collect raises on rank 0, and the launcher
    # then stops the ranks waiting here)
    ranks.wait_for_everyone()
    steps = learn(run, args, trainer, callback, out, version, it, steps, collect_s, tracker)
    ckpt = checkpoint(trainer, run, it)
    new_state = RunState(it, it, str(ckpt))
    if ranks.is_main_process:
        publish(run, urls, ckpt, it, phases.push_weights, tracker)
        new_state.write(run.run_dir)
        sync.prune_checkpoints(run.run_dir / "checkpoints", args.save_total_limit, keep=ckpt)
    # no rank starts the next iteration (or returns) before the state is written
    ranks.wait_for_everyone()
    return new_state, steps


def learn(
    run: RunConfig,
    args: Any,
    trainer: Any,
    callback: Any,
    out: Path,
    version: int,
    it: int,
    steps: int,
    collect_s: float,
    tracker: Tracker | None = None,
) -> int:
    """Every rank: the samples of the collect folder ``out`` (the same on every rank: built from the same files)
    and ``Trainer.train()`` on them (each rank its shard, DDP averages). Rank 0 logs the collect row (and, to
    ``tracker``, the summary of the iteration's steps). Returns the optimizer steps so far."""
    from accelerate import PartialState

    from trainer.grpo import append_metrics

    main = PartialState().is_main_process
    sampled, episodes = load_samples(run, args, out, version)
    if main:
        row = {"iteration": it, "phase": "collect", "step": None, "wall_s": round(collect_s, 3)}
        row |= collect_metrics(episodes, sampled.stats.zero_variance_groups) | sampled.stats.as_metrics()
        row |= staleness_metrics(sampled.samples, version)
        row["policy_version"] = version
        append_metrics(run.run_dir / METRICS_FILE, row)
        if tracker is not None:
            tracker.log_row(row)
        say(
            f"iteration {it}: reward {row.get('reward_mean', 0):.3f} ± {row.get('reward_std', 0):.3f}, "
            f"{sampled.stats.samples} samples, {sampled.stats.zero_variance_groups}/{sampled.stats.groups} groups "
            "without reward variance"
        )
        dropped = {k: v for k, v in sampled.stats.as_metrics().items() if k.startswith("dropped_") and v}
        if dropped:
            say(f"iteration {it}: sequences dropped: " + ", ".join(f"{k[8:]} {int(v)}" for k, v in dropped.items()))
    if not sampled.samples:
        if main:
            say(f"iteration {it}: no samples with a learning signal; weights unchanged")
        return steps
    trainer.train_dataset = list(sampled.samples)
    callback.begin_iteration(it, steps)
    trainer.reset_step_clock()
    trainer.train()
    if tracker is not None:
        tracker.end_update(it)
    return steps + int(trainer.state.global_step)


def checkpoint(trainer: Any, run: RunConfig, it: int) -> Path:
    """Every rank (saving is collective where weights are sharded); only rank 0 writes the folder."""
    return sync.save_checkpoint(trainer, run.run_dir / "checkpoints" / f"iter-{it:04d}")


Push = Callable[[Sequence[str], Path, int], sync.SyncResult]


def publish(
    run: RunConfig, urls: Sequence[str], ckpt: Path, it: int, push: Push, tracker: Tracker | None = None
) -> None:
    """Rank 0: every engine serves the checkpoint as policy version ``it``; the sync row goes to metrics.jsonl
    (and to ``tracker``)."""
    from trainer.grpo import append_metrics

    result = push(urls, ckpt, it)
    row: dict[str, Any] = {
        "iteration": it,
        "phase": "sync",
        "step": None,
        "wall_s": round(result.seconds, 3),
        "seconds": result.seconds,
        "engines": len(result.per_engine),
        "engine_seconds_max": max(result.per_engine.values()),
        "policy_version": it,
    }
    append_metrics(run.run_dir / METRICS_FILE, row)
    if tracker is not None:
        tracker.log_row(row)
    say(f"iteration {it}: {len(urls)} engine(s) serve {ckpt} as policy version {it} (sync {result.seconds:.2f} s)")
