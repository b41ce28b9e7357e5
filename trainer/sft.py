"""SFT mode: TRL's ``SFTTrainer`` on captured episodes, the loss on sampled tokens only (engine env).

Contract
--------
* Input: one or more collect run dirs (``episodes.parquet`` + ``records/``), e.g. a stronger teacher's rollouts
  served through the same proxy. :func:`select_episodes` keeps the episodes that pass :class:`EpisodeFilter`
  (default: the verifier passed; or ``reward >= min_reward``). Their sessions' call records become samples with
  :func:`addon.records.sequences.build_sequences`: one per agent path, auxiliary calls left out unless asked for, paths
  without a sampled token dropped. :func:`load_samples` raises :class:`SftDataError` naming the counts when
  nothing is left (no episode passes the filter, no records for the kept sessions, ...).
* Samples reach TRL pre-tokenized: ``input_ids`` plus ``completion_mask`` = the sequence's ``loss_mask`` (1 exactly
  on the sampled ids), with ``completion_only_loss=True``. TRL folds that mask into ``labels`` (-100 elsewhere)
  only when ``completion_only_loss`` is set: left at its default a pre-tokenized dataset trains on every token,
  so :func:`sft_args` always sets it (tests/engine_env/test_sft.py checks the collated labels).
* Output (``out``, default ``runs/sft/<run_id>``): ``config.json`` (the resolved :class:`SftConfig`),
  ``metrics.jsonl`` (rows ``{"iteration": 1, "phase": "train", "step", "wall_s", ...numeric logs}``, the
  training-run format that ``trainer.report`` reads) and ``checkpoint/`` (``save_pretrained`` model + tokenizer,
  loadable with ``from_pretrained`` and servable by ``trainer.engine``). TRL's own progress bar and ``report_to``
  backends are used as they are: ``--report-to`` (``$REPORT_TO``) is resolved by
  :func:`trainer.tracking.resolve_report_to` (``auto``, the default: trackio when installed; ``none``; or
  trackio/wandb/tensorboard), with ``run_name`` = the run id and ``project`` = ``harnessrl``. docs/evaluation.md
  has the details.

CLI: ``python -m trainer.sft --runs DIR [DIR ...] [--model M] [--out DIR] [--min-reward R] ...`` (``--help``).

Layout: config, episodes to samples, the TRL trainer, metrics log, run, CLI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from addon.records.schema import CallRecord, read_records, records_from_table
from addon.records.sequences import TrainingSequence, build_sequences
from tasks.episodes import EpisodeRecord, read_episodes
from trainer.model import DEFAULT_CACHE_DIR, resolve_model
from trainer.tracking import resolve_report_to

SFT_ITERATION = 1  # an SFT run is one training phase; metrics rows carry it so report.py reads them like RL rows


class SftDataError(ValueError):
    """The selected runs give nothing to train on; the message says what was found and what to change."""


# ------------------------------------------------------------------------------------------------ config


@dataclass(frozen=True)
class EpisodeFilter:
    """Which episodes become samples. ``min_reward`` None: the verifier passed; else ``reward >= min_reward``."""

    min_reward: float | None = None
    include_auxiliary: bool = False

    def keeps(self, episode: EpisodeRecord) -> bool:
        if episode.error is not None:
            return False
        if self.min_reward is None:
            return episode.verifier_passed
        return episode.reward >= self.min_reward

    def describe(self) -> str:
        return "verifier passed" if self.min_reward is None else f"reward >= {self.min_reward:g}"


@dataclass(frozen=True)
class SftConfig:
    runs: tuple[Path, ...]
    model: str = "default"
    cache_dir: Path = DEFAULT_CACHE_DIR
    out: Path | None = None  # None: runs/sft/<run_id>
    run_id: str = ""
    filter: EpisodeFilter = EpisodeFilter()
    epochs: float = 1.0
    max_steps: int = -1  # > 0 overrides epochs
    learning_rate: float = 1e-5
    batch_size: int = 1
    grad_accum: int = 1
    max_length: int | None = 8192  # the default model's context; longer paths are cut (keep_start)
    seed: int = 0
    report_to: str = "auto"  # trainer.tracking.resolve_report_to: auto (trackio when installed), none, or names

    def __post_init__(self) -> None:
        if not self.runs:
            raise ValueError("give at least one collect run dir (--runs)")
        if not self.run_id:
            object.__setattr__(self, "run_id", time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6])
        if self.out is None:
            object.__setattr__(self, "out", Path("runs/sft") / self.run_id)
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps must be > 0, or -1 for epochs; got {self.max_steps}")
        if not (self.epochs > 0 and self.learning_rate > 0 and self.batch_size >= 1 and self.grad_accum >= 1):
            raise ValueError("epochs and learning_rate must be positive; batch_size and grad_accum at least 1")
        if self.max_length is not None and self.max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {self.max_length}")
        resolve_report_to(self.report_to)  # an unknown or missing backend fails here, before any data is read

    @property
    def out_dir(self) -> Path:
        assert self.out is not None  # set in __post_init__
        return self.out

    def to_json(self) -> dict[str, Any]:
        raw = dataclasses.asdict(self)
        raw["runs"] = [str(p) for p in self.runs]
        raw["cache_dir"], raw["out"] = str(self.cache_dir), str(self.out)
        return raw


# ------------------------------------------------------------------------------------------------ episodes to samples


@dataclass(frozen=True)
class SftData:
    sequences: tuple[TrainingSequence, ...]
    episodes: int  # in the runs
    kept_episodes: int  # passing the filter
    auxiliary_dropped: int  # auxiliary paths left out
    empty_dropped: int  # paths without a sampled token

    @property
    def loss_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.sequences)


def select_episodes(episodes: Sequence[EpisodeRecord], flt: EpisodeFilter) -> list[EpisodeRecord]:
    return [e for e in episodes if flt.keeps(e)]


def _sessions(run: Path, wanted: set[str]) -> dict[str, list[CallRecord]]:
    records = run / "records"
    if not wanted or not any(records.rglob("shard-*.parquet")):
        return {}
    out: dict[str, list[CallRecord]] = defaultdict(list)
    for rec in records_from_table(read_records(records)):
        if rec.session_id in wanted:
            out[rec.session_id].append(rec)
    return out


def load_samples(runs: Sequence[Path], flt: EpisodeFilter) -> SftData:
    """The training samples of the episodes in ``runs`` that pass ``flt`` (see the module docstring)."""
    sequences: list[TrainingSequence] = []
    total = kept = aux = empty = 0
    for run in runs:
        if not (run / "episodes.parquet").is_file():
            raise SftDataError(f"{run}: no episodes.parquet (is it a collect run dir?)")
        episodes = read_episodes(run / "episodes.parquet")
        chosen = select_episodes(episodes, flt)
        total, kept = total + len(episodes), kept + len(chosen)
        for records in _sessions(run, {e.session_id for e in chosen}).values():
            for seq in build_sequences(records):
                if seq.auxiliary and not flt.include_auxiliary:
                    aux += 1
                elif not any(seq.loss_mask):
                    empty += 1
                else:
                    sequences.append(seq)
    where = ", ".join(str(r) for r in runs)
    if kept == 0:
        raise SftDataError(
            f"no episode passes the filter ({flt.describe()}): 0 of {total} in {where}; "
            "collect with a stronger teacher or lower --min-reward"
        )
    if not sequences:
        raise SftDataError(
            f"{kept} of {total} episodes pass ({flt.describe()}) but give no sample with sampled tokens "
            f"({aux} auxiliary paths left out, {empty} paths without sampled tokens; are records/ present in {where}?)"
        )
    return SftData(tuple(sequences), total, kept, aux, empty)


def dataset_rows(sequences: Sequence[TrainingSequence]) -> dict[str, list[list[int]]]:
    """Columns for ``datasets.Dataset.from_dict``: ``input_ids`` and ``completion_mask`` (the loss mask)."""
    return {
        "input_ids": [list(s.input_ids) for s in sequences],
        "completion_mask": [list(s.loss_mask) for s in sequences],
    }


# ------------------------------------------------------------------------------------------------ the TRL trainer


def sft_args(config: SftConfig) -> Any:
    """TRL's ``SFTConfig`` for ``config`` (``completion_only_loss=True``: see the module docstring)."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(config.out_dir / "trainer"),
        completion_only_loss=True,
        max_length=config.max_length,
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum,
        logging_steps=1,
        save_strategy="no",  # the final model is saved once, to checkpoint/
        report_to=resolve_report_to(config.report_to),
        run_name=config.run_id,
        project="harnessrl",
        seed=config.seed,
        bf16=False,
        dataloader_pin_memory=False,  # no accelerator on CPU: pinning only warns
        fp16=False,
    )


def build_trainer(config: SftConfig, model: Any, tokenizer: Any, sequences: Sequence[TrainingSequence]) -> Any:
    """An ``SFTTrainer`` over ``sequences`` that logs to ``out/metrics.jsonl``."""
    from datasets import Dataset
    from trl import SFTTrainer

    return SFTTrainer(
        model=model,
        args=sft_args(config),
        train_dataset=Dataset.from_dict(dataset_rows(sequences)),
        processing_class=tokenizer,
        callbacks=[metrics_callback(config.out_dir / "metrics.jsonl")],
    )


# ------------------------------------------------------------------------------------------------ metrics log


def metrics_row(step: int, wall_s: float, logs: dict[str, Any]) -> dict[str, Any]:
    """A ``phase: train`` row of metrics.jsonl from one TRL log dict (non-numeric and non-finite values dropped)."""
    row: dict[str, Any] = {"iteration": SFT_ITERATION, "phase": "train", "step": step, "wall_s": round(wall_s, 3)}
    for key, value in logs.items():
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            row[key] = value
    return row


def metrics_callback(path: Path) -> Any:
    """A ``TrainerCallback`` appending one :func:`metrics_row` per TRL log event to ``path``."""
    from transformers import TrainerCallback

    class MetricsLog(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
        def __init__(self) -> None:
            self.started = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
            if logs and state.is_world_process_zero:
                row = metrics_row(state.global_step, time.monotonic() - self.started, logs)
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")

    return MetricsLog()


# ------------------------------------------------------------------------------------------------ run


def run(config: SftConfig, log: Any = sys.stderr) -> Path:
    """Train and save; returns the checkpoint folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = load_samples(config.runs, config.filter)
    print(
        f"sft: {data.kept_episodes} of {data.episodes} episodes pass ({config.filter.describe()}); "
        f"{len(data.sequences)} samples, {data.loss_tokens} loss tokens "
        f"({data.auxiliary_dropped} auxiliary paths left out, {data.empty_dropped} without sampled tokens)",
        file=log,
    )
    out = config.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.to_json(), indent=2) + "\n")
    folder = resolve_model(config.model, config.cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    trainer = build_trainer(config, model, tokenizer, data.sequences)
    trainer.train()
    checkpoint = out / "checkpoint"
    trainer.save_model(str(checkpoint))
    tokenizer.save_pretrained(str(checkpoint))
    (out / "state.json").write_text(json.dumps({"iteration": SFT_ITERATION, "checkpoint": str(checkpoint)}) + "\n")
    print(f"sft: checkpoint in {checkpoint}", file=log)
    return checkpoint


# ------------------------------------------------------------------------------------------------ CLI


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer.sft", description=__doc__.splitlines()[0])
    p.add_argument("--runs", nargs="+", type=Path, required=True, help="collect run dirs (episodes + records)")
    p.add_argument("--model", default="default", help="base model: 'default', a folder or a hub id")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    p.add_argument("--out", type=Path, default=None, help="default: runs/sft/<run-id>")
    p.add_argument("--run-id", default="")
    p.add_argument("--min-reward", type=float, default=None, help="keep reward >= this (default: passed only)")
    p.add_argument("--include-auxiliary", action="store_true", help="also train auxiliary calls (titles, ...)")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=-1, help="> 0 overrides --epochs")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--max-length", type=int, default=8192, help="0: no limit")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--report-to",
        default=os.environ.get("REPORT_TO") or "auto",
        help="trackio, wandb, tensorboard (comma-separated), auto (trackio when installed) or none ($REPORT_TO)",
    )
    return p


def config_from_args(args: argparse.Namespace) -> SftConfig:
    return SftConfig(
        runs=tuple(args.runs),
        model=args.model,
        cache_dir=args.cache_dir,
        out=args.out,
        run_id=args.run_id,
        filter=EpisodeFilter(args.min_reward, args.include_auxiliary),
        epochs=args.epochs,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        max_length=args.max_length or None,
        seed=args.seed,
        report_to=args.report_to,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        run(config_from_args(args))
    except (SftDataError, ValueError) as e:
        print(f"sft: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
