"""The training loop: collect -> samples -> train -> checkpoint -> sync, for N iterations, resumable.

Contract
--------
* :func:`train_run` runs iterations ``state.iteration + 1 .. run.iterations`` in ``run.run_dir`` (layout in
  docs/training.md). Before the first, the engine is made to serve the weights the trainer starts from (the base
  model, or the last checkpoint of ``state.json`` when resuming) under their policy version (0 for the base), so
  every record of the next collect carries a version the trainer knows.
* Per iteration: *collect* runs ``tasks.collect`` in the proxy env as a subprocess (G = ``num_generations``
  rollouts per task and harness, on the engine's current weights; it prints its own progress), then
  :func:`trainer.samples.build_samples` against the current version; *train* runs ``Trainer.train()`` on those
  samples (the same trainer object every iteration: the optimizer state carries over; a Trainer restarts its
  step count per ``train()``, so the metrics rows add an offset); *checkpoint* saves model, tokenizer and
  optimizer; *sync* pushes the checkpoint to the engine as version = iteration; then ``state.json`` is written
  (tmp + rename), so an interrupted run resumes after the last completed iteration. An iteration without samples
  (every group had equal rewards) skips the update but still checkpoints and syncs, so versions stay aligned with
  iterations.
* Metrics rows (``collect``, ``train`` via :class:`~trainer.grpo.MetricsFileCallback`, ``sync``) go to
  ``metrics.jsonl``.
* The engine: ``run.engine_url`` is reused; otherwise one is started (trainer/engine.py) in ``run_dir/engine`` and
  stopped at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from addon.records import read_records, records_from_table
from tasks.episodes import EpisodeRecord, read_episodes
from trainer import sync
from trainer.config import RunConfig, check_grpo_config, scale_rewards_mode, to_json
from trainer.samples import SampleOptions, SampleSet, build_samples, collect_metrics

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
    print(f"[train] {message}", file=sys.stderr, flush=True)


def collect_command(run: RunConfig, group_size: int, url: str, out: Path, iteration: int) -> list[str]:
    """The ``tasks.collect`` command line. No ``--seed``: it seeds every call alike, so the G rollouts of a task
    would be identical and their group would carry no signal."""
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


def start_engine(run: RunConfig) -> tuple[str, bool]:
    """The engine URL and whether this run started it (and so stops it)."""
    from trainer.engine import EngineConfig, ensure_engine
    from trainer.model import resolve_model

    engine_dir = run.run_dir / "engine"
    if run.engine_url:
        url, _ = ensure_engine(engine_dir, run.engine_url)
        return url, False
    model = resolve_model(run.model, run.cache_dir)
    url, state = ensure_engine(engine_dir, None, EngineConfig.for_model(model, engine_dir, port=0))
    return url, state is not None


def build_trainer(run: RunConfig, args: Any, start_from: str, metrics: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.grpo import CapturedGRPOTrainer, LossSettings

    model = AutoModelForCausalLM.from_pretrained(start_from, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(start_from)
    eps_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    settings = LossSettings(args.epsilon, eps_high, run.is_cap, args.loss_type)
    return CapturedGRPOTrainer(
        model=model, args=args, processing_class=tokenizer, callbacks=[metrics], loss_settings=settings
    )


def train_run(run: RunConfig, args: Any) -> RunState:
    """Run (or resume) the training run; returns the final state. See the module docstring."""
    from trainer.grpo import MetricsFileCallback
    from trainer.model import resolve_model

    check_grpo_config(args)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    (run.run_dir / "config.json").write_text(to_json(run, args))
    metrics_path = run.run_dir / METRICS_FILE
    state = RunState.read(run.run_dir) or RunState(0, 0, resolve_model(run.model, run.cache_dir))
    if state.iteration >= run.iterations:
        say(f"{run.run_dir} already completed {state.iteration} of {run.iterations} iterations")
        return state
    url, started = start_engine(run)
    try:
        seconds = sync.sync_weights(url, Path(state.checkpoint), state.policy_version)
        say(f"engine {url} serves {state.checkpoint} as policy version {state.policy_version} ({seconds:.2f} s)")
        callback = MetricsFileCallback(metrics_path)
        trainer = build_trainer(run, args, state.checkpoint, callback)
        if state.iteration and sync.load_optimizer_state(trainer, Path(state.checkpoint)):
            say(f"resumed after iteration {state.iteration} with its optimizer state")
        steps = 0
        for it in range(state.iteration + 1, run.iterations + 1):
            state, steps = iteration(run, args, url, trainer, callback, state, it, steps)
    finally:
        if started:
            from trainer.engine import stop

            stop(run.run_dir / "engine")
    return state


def iteration(
    run: RunConfig, args: Any, url: str, trainer: Any, callback: Any, state: RunState, it: int, steps: int
) -> tuple[RunState, int]:
    """One collect -> train -> checkpoint -> sync round; returns the new state and the optimizer steps so far."""
    from trainer.grpo import append_metrics

    metrics_path = run.run_dir / METRICS_FILE
    version = state.policy_version
    out = run.run_dir / f"iter-{it:04d}" / "collect"
    say(f"iteration {it}/{run.iterations}: collect on policy version {version}")
    t0 = time.monotonic()
    collect(run, args.num_generations, url, out, it)
    sampled, episodes = load_samples(run, args, out, version)
    row = {"iteration": it, "phase": "collect", "step": None, "wall_s": round(time.monotonic() - t0, 3)}
    row |= collect_metrics(episodes, sampled.stats.zero_variance_groups) | sampled.stats.as_metrics()
    row["policy_version"] = version
    append_metrics(metrics_path, row)
    say(
        f"iteration {it}: reward {row.get('reward_mean', 0):.3f} ± {row.get('reward_std', 0):.3f}, "
        f"{sampled.stats.samples} samples, {sampled.stats.zero_variance_groups}/{sampled.stats.groups} groups "
        "without reward variance"
    )
    dropped = {k: v for k, v in sampled.stats.as_metrics().items() if k.startswith("dropped_") and v}
    if dropped:
        say(f"iteration {it}: sequences dropped: " + ", ".join(f"{k[8:]} {int(v)}" for k, v in dropped.items()))
    if sampled.samples:
        trainer.train_dataset = list(sampled.samples)
        callback.begin_iteration(it, steps)
        trainer.reset_step_clock()
        trainer.train()
        steps += int(trainer.state.global_step)
    else:
        say(f"iteration {it}: no samples with a learning signal; weights unchanged")
    ckpt = sync.save_checkpoint(trainer, run.run_dir / "checkpoints" / f"iter-{it:04d}")
    seconds = sync.sync_weights(url, ckpt, it)
    append_metrics(
        metrics_path,
        {
            "iteration": it,
            "phase": "sync",
            "step": None,
            "wall_s": round(seconds, 3),
            "seconds": seconds,
            "policy_version": it,
        },
    )
    say(f"iteration {it}: engine serves {ckpt} as policy version {it} (sync {seconds:.2f} s)")
    new_state = RunState(it, it, str(ckpt))
    new_state.write(run.run_dir)
    sync.prune_checkpoints(run.run_dir / "checkpoints", args.save_total_limit, keep=ckpt)
    return new_state, steps
