"""Experiment tracking: which ``report_to`` backends a run uses, and the per-iteration rows it sends them.

Contract
--------
* :func:`resolve_report_to` turns ``--report-to`` into the list for TRL's ``GRPOConfig``/``SFTConfig.report_to``:
  ``auto`` (the default) is ``["trackio"]`` when trackio is importable, else ``[]``; ``none`` (or empty) is ``[]``;
  otherwise comma-separated names of :data:`BACKENDS`. An unknown name, or a backend whose package is missing,
  raises :class:`~trainer.config.ConfigError` saying what to write or install. transformers' own callbacks then
  log every optimizer step (``train/loss``, ``train/logprob_diff_mean``, ...).
* :class:`Tracker` sends the per-iteration rows of ``metrics.jsonl`` to the same backends, through their public
  APIs (``trackio.init/log/finish``, ``wandb.init/define_metric/log/finish``, tensorboard's ``SummaryWriter``):
  each number of a ``collect``/``sync``/``eval`` row as ``<phase>/<key>`` (e.g. ``collect/pass_at_1/pi``) with
  ``iteration``; the ``train`` rows of an iteration (one per optimizer step) are summed up by :func:`update_metrics`
  and sent as ``update/<key>`` when :meth:`Tracker.end_update` is called. trackio writes into the run of the same
  ``project`` and ``run_name`` as transformers' TrackioCallback (``resume="allow"``), locally (``$TRACKIO_DIR``,
  default ``~/.cache/huggingface/trackio``) unless ``TRACKIO_SPACE_ID`` is set. With no backend it does nothing.
* Only the main process should own a Tracker with backends; other ranks use ``Tracker(())``.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainer.config import ConfigError

BACKENDS = ("trackio", "wandb", "tensorboard")
PACKAGES = {"trackio": ("trackio",), "wandb": ("wandb",), "tensorboard": ("tensorboard", "tensorboardX")}
ROW_KEYS = frozenset({"iteration", "phase", "step"})  # the row's coordinates, not metrics
SUMMED = frozenset({"samples", "trained_tokens"})  # an iteration's total; keys ending in _max: the maximum


def default_report_to() -> list[str]:
    """``["trackio"]`` when trackio is installed, else ``[]``."""
    return ["trackio"] if importlib.util.find_spec("trackio") is not None else []


def resolve_report_to(value: str | Sequence[str] | None) -> list[str]:
    """``--report-to`` as TRL's ``report_to`` list (see the module docstring)."""
    names = value.split(",") if isinstance(value, str) else list(value or [])
    names = [n.strip() for n in names if n.strip()]
    if names in ([], ["none"]):
        return []
    if names == ["auto"]:
        return default_report_to()
    out: list[str] = []
    for name in names:
        if name not in BACKENDS:
            raise ConfigError(
                f"report_to: unknown backend {name!r}; write --report-to (make: REPORT_TO=) as one or more of "
                f"{', '.join(BACKENDS)} (comma-separated), 'auto' (trackio when installed) or 'none'"
            )
        if not any(importlib.util.find_spec(p) is not None for p in PACKAGES[name]):
            raise ConfigError(
                f"report_to: {name} is not installed in this environment; `pip install {PACKAGES[name][0]}` "
                "or choose another backend (--report-to none switches tracking off)"
            )
        if name not in out:
            out.append(name)
    return out


def row_metrics(row: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics.jsonl row as ``<phase>/<key>``, plus ``iteration``."""
    phase = str(row.get("phase", "row"))
    out = {f"{phase}/{k}": float(v) for k, v in row.items() if k not in ROW_KEYS and _number(v)}
    if _number(row.get("iteration")):
        out["iteration"] = float(row["iteration"])
    return out


def update_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """One iteration's ``train`` rows (one per optimizer step) summed up: ``steps``; ``samples`` and
    ``trained_tokens`` totals; ``*_max`` maxima; every other number averaged over the steps weighted by their
    ``trained_tokens`` (so ``logprob_diff_mean`` is the mean over all the iteration's trained tokens)."""
    if not rows:
        return {}
    weights = [float(r.get("trained_tokens", 0.0)) if _number(r.get("trained_tokens")) else 0.0 for r in rows]
    if sum(weights) <= 0:
        weights = [1.0] * len(rows)
    keys = dict.fromkeys(k for r in rows for k, v in r.items() if k not in ROW_KEYS and _number(v))
    out: dict[str, float] = {"steps": float(len(rows))}
    for key in keys:
        pairs = [(float(r[key]), w) for r, w in zip(rows, weights, strict=True) if _number(r.get(key))]
        values = [v for v, _ in pairs]
        if key in SUMMED:
            out[key] = sum(values)
        elif key.endswith("_max") or key == "wall_s":
            out[key] = max(values)
        else:
            total = sum(w for _, w in pairs)
            out[key] = sum(v * w for v, w in pairs) / total if total > 0 else sum(values) / len(values)
    return out


class Tracker:
    """Sends per-iteration rows to ``backends`` (a subset of :data:`BACKENDS`; empty: does nothing).
    ``log_dir`` is the Trainer's ``output_dir``: wandb's files and tensorboard's event files go under it."""

    def __init__(self, backends: Sequence[str], project: str = "harnessrl", run_name: str = "run",
                 log_dir: Path = Path("runs")) -> None:  # fmt: skip
        unknown = sorted(set(backends) - set(BACKENDS))
        if unknown:
            raise ConfigError(f"Tracker: unknown backends {unknown}; use {', '.join(BACKENDS)}")
        self.backends = tuple(backends)
        self.project, self.run_name, self.log_dir = project, run_name, Path(log_dir)
        self._train_rows: list[Mapping[str, Any]] = []
        self._trackio_run: Any = None
        self._wandb: Any = None
        self._writer: Any = None

    @classmethod
    def for_args(cls, args: Any, run_dir: Path, enabled: bool = True) -> Tracker:
        """The backends, project and run name of a TrainingArguments (the same trackio run as transformers');
        ``enabled`` False (not the main process): a Tracker that does nothing."""
        backends = [b for b in (args.report_to or []) if b in BACKENDS] if enabled else []
        name = args.run_name or Path(run_dir).name
        return cls(backends, getattr(args, "project", None) or "harnessrl", name, Path(args.output_dir))

    def log_row(self, row: Mapping[str, Any]) -> None:
        """A metrics.jsonl row: ``train`` rows wait for :meth:`end_update`; the others are sent now."""
        if not self.backends:
            return
        if row.get("phase") == "train":
            self._train_rows.append(dict(row))
            return
        self._send(row_metrics(row))

    def end_update(self, iteration: int) -> None:
        """Send the summary of the ``train`` rows logged since the last call as ``update/<key>``."""
        rows, self._train_rows = self._train_rows, []
        summary = update_metrics(rows)
        if summary and self.backends:
            self._send({**{f"update/{k}": v for k, v in summary.items()}, "iteration": float(iteration)})

    def close(self) -> None:
        """Finish what this Tracker opened (the trackio run if still current, the wandb run, the writer)."""
        if self._trackio_run is not None:
            import trackio

            if trackio.context_vars.current_run.get() is self._trackio_run:
                trackio.finish()
            self._trackio_run = None
        if self._wandb is not None and self._wandb.run is not None:
            self._wandb.finish()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _send(self, metrics: dict[str, float]) -> None:
        if "trackio" in self.backends:
            import trackio

            # transformers' TrackioCallback opens and finishes the run around every train(): re-open it by name
            if self._trackio_run is None or trackio.context_vars.current_run.get() is not self._trackio_run:
                self._trackio_run = trackio.init(project=self.project, name=self.run_name, resume="allow",
                                                 auto_log_cpu=False, auto_log_gpu=False)  # fmt: skip
            trackio.log(metrics)
        if "wandb" in self.backends:
            import wandb

            if wandb.run is None:  # transformers' WandbCallback reuses this run
                wandb.init(project=self.project, name=self.run_name, dir=str(self.log_dir))
            if self._wandb is None:
                wandb.define_metric("iteration")
                for phase in ("collect", "update", "sync", "eval"):
                    wandb.define_metric(f"{phase}/*", step_metric="iteration")
                self._wandb = wandb
            wandb.log(metrics)
        if "tensorboard" in self.backends:
            self._tensorboard_writer()
            step = int(metrics.get("iteration", 0))
            for key, value in metrics.items():
                if key != "iteration":
                    self._writer.add_scalar(key, value, global_step=step)
            self._writer.flush()

    def _tensorboard_writer(self) -> None:
        if self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                from tensorboardX import SummaryWriter
            # beside transformers' per-step event files ($TENSORBOARD_LOGGING_DIR, else <output_dir>/runs/<date>)
            root = os.environ.get("TENSORBOARD_LOGGING_DIR") or str(self.log_dir / "runs")
            self._writer = SummaryWriter(log_dir=str(Path(root) / "iterations"))


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
