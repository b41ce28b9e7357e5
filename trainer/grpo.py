"""The update: PPO-clip against the CAPTURED behaviour logprobs, as a ``transformers.Trainer`` subclass.

Contract
--------
* :func:`collate` pads :class:`~trainer.samples.Sample` rows (right padding) into tensors: ``input_ids``,
  ``attention_mask``, ``loss_mask``, ``behaviour_logprobs``, ``temperatures``, ``advantages``, ``weights`` and
  ``labels`` (input ids, -100 off the loss mask: only so the Trainer counts the active tokens of the accumulated
  batch, ``num_items_in_batch``, which the ``dapo`` normalisation needs; the model never sees them).
* :func:`policy_logprobs` recomputes log pi_theta of each target token (logits at position t-1 for the token at t,
  divided by the temperature the engine sampled that token with). Only positions whose target is on the loss mask
  go through the LM head (``logits_to_keep`` with an index tensor), so long agent prompts cost no vocab-sized
  logits.
* :func:`ppo_loss`: ``ratio = exp(logp_theta - logp_captured)`` on loss-mask tokens, optionally truncated from
  above at ``is_cap``; per-token loss ``-min(ratio * A, clip(ratio, 1-eps, 1+eps_high) * A) * weight``;
  normalisation per TRL's ``loss_type``: ``grpo`` (mean per sequence, then over sequences), ``bnpo`` (over the
  micro-batch's active tokens), ``dapo`` (over the active tokens of the whole accumulated batch). It returns the
  loss already scaled for gradient accumulation (the trainer sets ``loss_is_scaled_for_ga``) and
  :class:`StepStats` (sums and maxima, merged over micro-batches).
* :class:`CapturedGRPOTrainer` overrides only ``compute_loss`` and ``log`` (public extension points): every logged
  optimizer step carries loss, kl (k3 estimate of KL(behaviour || theta)), clip_ratio, is_ratio_mean/max,
  logprob_diff_mean/max (|captured - recomputed|), tokens_per_s and samples, so ``report_to`` backends and the
  callbacks see them. :class:`MetricsFileCallback` writes those rows to ``metrics.jsonl`` (main process only) and
  hands each to its ``on_row`` (the loop's :class:`~trainer.tracking.Tracker`, which sums up an iteration's steps).
* Several processes (``accelerate launch``, DDP): each rank trains on its shard of the same samples and DDP
  averages the gradients. ``dapo``'s normaliser is then the token count of the accumulated batch over *all* ranks
  (the Trainer gathers it when ``average_tokens_across_devices``), so each rank's loss is multiplied by the number
  of processes to undo DDP's averaging: the update equals one process training on the whole batch. The logged
  statistics are reduced over the ranks (sums summed, maxima max'ed) before logging, so they describe the whole
  optimizer step, not rank 0's share.

Torch and transformers are imported here: this module belongs to the engine env.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from trainer.samples import Sample

IGNORE = -100


def collate(samples: Sequence[Sample], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded tensors of a list of samples (see the module docstring)."""
    width = max(len(s.input_ids) for s in samples)

    def pad(rows: list[Sequence[Any]], value: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)

    ids = pad([s.input_ids for s in samples], pad_id, torch.long)
    mask = pad([s.loss_mask for s in samples], 0, torch.long)
    return {
        "input_ids": ids,
        "attention_mask": pad([[1] * len(s.input_ids) for s in samples], 0, torch.long),
        "loss_mask": mask,
        "behaviour_logprobs": pad([s.behaviour_logprobs for s in samples], 0.0, torch.float32),
        "temperatures": pad([s.temperatures for s in samples], 1.0, torch.float32),
        "advantages": torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        "weights": torch.tensor([s.weight for s in samples], dtype=torch.float32),
        "labels": torch.where(mask.bool(), ids, torch.full_like(ids, IGNORE)),
    }


def policy_logprobs(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log pi_theta of the target tokens at the kept positions, and those positions' target indices.

    Returns ``(logp [B, K], targets [K])``: ``targets`` are the sequence positions (1..T-1) whose token is on some
    row's loss mask; ``logp[b, k]`` is the model's log-probability of ``input_ids[b, targets[k]]``.
    """
    on_mask = batch["loss_mask"][:, 1:].any(dim=0)
    targets = torch.nonzero(on_mask).flatten() + 1
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        logits_to_keep=targets - 1,
        use_cache=False,
    )
    logits = out.logits.float() / batch["temperatures"][:, targets].unsqueeze(-1)
    tokens = batch["input_ids"][:, targets]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return logp, targets


@dataclass(frozen=True)
class StepStats:
    """Sums over loss-mask tokens (means are taken when logging) and maxima, of one or more micro-batches."""

    tokens: float = 0.0
    seq_tokens: float = 0.0  # every token the forward pass processed (for tokens/s)
    samples: float = 0.0
    logprob_diff_sum: float = 0.0
    logprob_diff_max: float = 0.0
    ratio_sum: float = 0.0
    ratio_max: float = 0.0
    clipped: float = 0.0
    kl_sum: float = 0.0

    def merge(self, other: StepStats) -> StepStats:
        return StepStats(
            tokens=self.tokens + other.tokens,
            seq_tokens=self.seq_tokens + other.seq_tokens,
            samples=self.samples + other.samples,
            logprob_diff_sum=self.logprob_diff_sum + other.logprob_diff_sum,
            logprob_diff_max=max(self.logprob_diff_max, other.logprob_diff_max),
            ratio_sum=self.ratio_sum + other.ratio_sum,
            ratio_max=max(self.ratio_max, other.ratio_max),
            clipped=self.clipped + other.clipped,
            kl_sum=self.kl_sum + other.kl_sum,
        )

    def metrics(self) -> dict[str, float]:
        n = max(self.tokens, 1.0)
        return {
            "kl": self.kl_sum / n,
            "clip_ratio": self.clipped / n,
            "is_ratio_mean": self.ratio_sum / n,
            "is_ratio_max": self.ratio_max,
            "logprob_diff_mean": self.logprob_diff_sum / n,
            "logprob_diff_max": self.logprob_diff_max,
            "samples": self.samples,
            "trained_tokens": self.tokens,
        }


@dataclass(frozen=True)
class LossSettings:
    epsilon: float = 0.2
    epsilon_high: float = 0.2
    is_cap: float | None = None
    loss_type: str = "dapo"


def ppo_loss(
    logp: torch.Tensor,
    behaviour: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    weights: torch.Tensor,
    settings: LossSettings,
    normaliser: float,
) -> tuple[torch.Tensor, StepStats]:
    """The PPO-clip loss against the behaviour logprobs (tensors [B, K]; advantages and weights [B]).

    ``normaliser`` divides the summed loss: for ``dapo`` the active tokens of the accumulated batch, for ``grpo``
    and ``bnpo`` the number of micro-batches accumulated (their loss is a per-micro-batch mean).
    """
    m = mask.float()
    log_ratio = logp - behaviour
    ratio = torch.exp(log_ratio)
    if settings.is_cap is not None:
        ratio = torch.clamp(ratio, max=settings.is_cap)  # truncated IS: no gradient beyond the cap
    adv = advantages.unsqueeze(1)
    clipped_ratio = torch.clamp(ratio, 1 - settings.epsilon, 1 + settings.epsilon_high)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv) * weights.unsqueeze(1)
    if settings.loss_type == "grpo":
        per_seq = (per_token * m).sum(1) / m.sum(1).clamp(min=1)
        has = (m.sum(1) > 0).float()
        loss = (per_seq * has).sum() / has.sum().clamp(min=1) / normaliser
    elif settings.loss_type == "bnpo":
        loss = (per_token * m).sum() / m.sum().clamp(min=1) / normaliser
    elif settings.loss_type == "dapo":
        loss = (per_token * m).sum() / normaliser
    else:
        raise ValueError(f"loss_type {settings.loss_type!r} is not implemented here (dapo, grpo, bnpo are)")
    with torch.no_grad():
        on = m.bool()
        diff = log_ratio.abs()[on]
        r = torch.exp(log_ratio)[on]
        a = adv.expand_as(m)[on]
        clip = ((r < 1 - settings.epsilon) & (a < 0)) | ((r > 1 + settings.epsilon_high) & (a > 0))
        neg = -log_ratio[on]  # log(behaviour / theta)
        stats = StepStats(
            tokens=float(on.sum()),
            samples=float(mask.shape[0]),
            logprob_diff_sum=float(diff.sum()),
            logprob_diff_max=float(diff.max()) if diff.numel() else 0.0,
            ratio_sum=float(r.sum()),
            ratio_max=float(r.max()) if r.numel() else 0.0,
            clipped=float(clip.sum()),
            kl_sum=float((torch.exp(neg) - neg - 1).sum()),
        )
    return loss, stats


class CapturedGRPOTrainer(Trainer):
    """``Trainer`` whose loss is :func:`ppo_loss` against the captured logprobs (see the module docstring)."""

    def __init__(self, *args: Any, loss_settings: LossSettings, **kwargs: Any) -> None:
        kwargs.setdefault("data_collator", collate)
        super().__init__(*args, **kwargs)
        self.loss_settings = loss_settings
        self.loss_is_scaled_for_ga = True  # ppo_loss divides by the accumulation itself
        self._pending = StepStats()
        self._last_log = time.monotonic()

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> Any:
        logp, targets = policy_logprobs(model, inputs)
        mask = inputs["loss_mask"][:, targets]
        # set by the training loop per accumulated batch (the last one may be shorter); outside it, the configured one
        ga = float(getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps))
        if self.loss_settings.loss_type == "dapo":
            # the accumulated batch's active tokens; without the Trainer's count, this micro-batch's times GA
            normaliser = float(num_items_in_batch) if num_items_in_batch is not None else float(mask.sum()) * ga
            if num_items_in_batch is not None and self.args.average_tokens_across_devices and self.args.world_size > 1:
                # the count covers every rank's tokens while DDP averages the ranks' gradients: scale back up
                normaliser /= self.accelerator.num_processes
        else:
            normaliser = ga
        loss, stats = ppo_loss(
            logp,
            inputs["behaviour_logprobs"][:, targets],
            mask,
            inputs["advantages"],
            inputs["weights"],
            self.loss_settings,
            max(normaliser, 1.0),
        )
        seq = StepStats(seq_tokens=float(inputs["attention_mask"].sum()))
        self._pending = self._pending.merge(stats).merge(seq)
        return (loss, None) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:  # a training-step log: add this step's captured-vs-recomputed statistics
            now = time.monotonic()
            # every rank logs each step (the Trainer gathers the loss there too), so the reduction is collective
            step = self._all_ranks(self._pending)
            logs.update(step.metrics())
            logs["tokens_per_s"] = step.seq_tokens / max(now - self._last_log, 1e-9)
            self._pending = StepStats()
            self._last_log = now
        super().log(logs, start_time)

    def _all_ranks(self, stats: StepStats) -> StepStats:
        """``stats`` summed (maxima max'ed) over the processes; itself with one process."""
        if self.accelerator.num_processes == 1:
            return stats
        sums = ("tokens", "seq_tokens", "samples", "logprob_diff_sum", "ratio_sum", "clipped", "kl_sum")
        maxima = ("logprob_diff_max", "ratio_max")
        device = self.accelerator.device
        summed = self.accelerator.reduce(
            torch.tensor([getattr(stats, k) for k in sums], dtype=torch.float64, device=device), reduction="sum"
        )
        gathered = self.accelerator.gather(
            torch.tensor([[getattr(stats, k) for k in maxima]], dtype=torch.float64, device=device)
        )
        top = gathered.max(dim=0).values
        return StepStats(
            **{k: float(v) for k, v in zip(sums, summed.tolist(), strict=True)},
            **{k: float(v) for k, v in zip(maxima, top.tolist(), strict=True)},
        )

    def reset_step_clock(self) -> None:
        """Start the tokens/s clock now (the loop calls it before each train(): collect time is not train time)."""
        self._last_log = time.monotonic()
        self._pending = StepStats()


class MetricsFileCallback(TrainerCallback):
    """Appends one ``train`` row per logged optimizer step to ``metrics.jsonl`` (format: docs/training.md), and
    passes it to ``on_row`` when given."""

    def __init__(self, path: Path, on_row: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = path
        self.on_row = on_row
        self.iteration = 0
        self.step_offset = 0  # optimizer steps of earlier iterations (a Trainer restarts its count per train())
        self.started = time.monotonic()

    def begin_iteration(self, iteration: int, step_offset: int) -> None:
        self.iteration, self.step_offset, self.started = iteration, step_offset, time.monotonic()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any) -> None:
        if not logs or "loss" not in logs or not state.is_world_process_zero:
            return
        row: dict[str, Any] = {
            "iteration": self.iteration,
            "phase": "train",
            "step": self.step_offset + int(state.global_step),
            "wall_s": round(time.monotonic() - self.started, 3),
        }
        row.update({k: float(v) for k, v in logs.items() if isinstance(v, int | float) and k != "epoch"})
        append_metrics(self.path, row)
        if self.on_row is not None:
            self.on_row(row)


def append_metrics(path: Path, row: dict[str, Any]) -> None:
    """One JSON object per line; appended and flushed so a crash leaves every finished row readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
