"""Training samples of one collect: episodes + call records -> pre-tokenized, weighted, advantage-carrying samples.

Contract
--------
* :func:`build_samples` takes the episodes of a collect and its call records. Per episode it builds the session's
  training sequences with :func:`addon.records.sequences.build_sequences` (one per agent path; the loss mask is 1
  exactly
  on the ids the model sampled, the behaviour logprobs are the captured ones) and makes one :class:`Sample` per
  sequence. Auxiliary paths (titles, summaries) are excluded unless ``include_auxiliary``.
* Advantages are group-normalised rewards over the G rollouts of a group: ``grouping="task"`` groups a task's
  rollouts across harnesses (``task_group_id``), ``"task_harness"`` per task x harness (``group_id``).
  ``scale_rewards`` follows TRL: ``group`` divides by the group's standard deviation, ``batch`` by the whole
  collect's, ``none`` does not divide. A group whose rewards are all equal carries no signal: its samples are
  dropped (they would contribute zero gradient) and counted in ``zero_variance_groups``. Episodes the collector
  itself failed on (``error`` set: the harness never ran) are not rollouts of the policy and are left out.
* A sample's ``weight`` is its harness's weight (multiplies its loss). ``temperatures`` holds, per token, the
  sampling temperature the engine applied to the call that sampled it (1.0 off the mask), so the trainer
  recomputes the logprobs of the distribution that was actually sampled from.
* Staleness: a sample's version is the oldest ``policy_version`` among its trained calls. Against
  ``current_version``: ``refuse`` drops any sample older than current (or unversioned); ``is_correct`` keeps
  samples at most ``max_staleness`` versions old (the ratio against the captured logprobs corrects them) and drops
  older ones. Sequences longer than ``max_length`` are dropped, never cut (a cut would leave half a turn).
  Every drop is counted in :class:`SampleStats`.
* :func:`collect_metrics` is the ``collect`` row of ``metrics.jsonl`` (reward mean/std, pass@1 and tool calls per
  harness, zero-variance groups); :func:`staleness_metrics` adds the samples' policy-version lag to it.

Imports only the standard library and the stdlib+pyarrow modules of addon/ and tasks/, so it runs in either env.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from addon.records.schema import CallRecord
from addon.records.sequences import TrainingSequence, build_sequences
from tasks.episodes import EpisodeRecord

ScaleRewards = Literal["group", "batch", "none"]
STD_EPS = 1e-4  # as TRL: keeps a tiny-variance group from blowing up its advantages


@dataclass(frozen=True)
class Sample:
    session_id: str
    group: str
    harness: str
    reward: float
    advantage: float
    weight: float
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    temperatures: tuple[float, ...]
    policy_version: int | None  # the oldest version among the trained calls

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass(frozen=True)
class SampleStats:
    episodes: int = 0
    errored_episodes: int = 0
    groups: int = 0
    zero_variance_groups: int = 0
    sequences: int = 0
    samples: int = 0
    dropped_zero_variance: int = 0
    dropped_auxiliary: int = 0
    dropped_empty: int = 0
    dropped_stale: int = 0
    dropped_too_long: int = 0
    trained_tokens: int = 0

    def as_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class SampleSet:
    samples: tuple[Sample, ...]
    stats: SampleStats
    advantages: Mapping[str, float] = field(default_factory=dict)  # session id -> advantage


@dataclass(frozen=True)
class SampleOptions:
    grouping: Literal["task", "task_harness"] = "task"
    scale_rewards: ScaleRewards = "group"
    harness_weights: Mapping[str, float] = field(default_factory=dict)
    include_auxiliary: bool = False
    staleness: Literal["refuse", "is_correct"] = "is_correct"
    max_staleness: int = 1
    current_version: int | None = None  # None: no staleness check (e.g. SFT-style reuse)
    max_length: int = 8192


def group_key(episode: EpisodeRecord, grouping: Literal["task", "task_harness"]) -> str:
    return episode.task_group_id if grouping == "task" else episode.group_id


def advantages(
    episodes: Sequence[EpisodeRecord], grouping: Literal["task", "task_harness"], scale: ScaleRewards
) -> tuple[dict[str, float], int, int]:
    """Advantage per session id, the number of groups and of zero-variance groups (their sessions are absent)."""
    groups: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for e in episodes:
        groups[group_key(e, grouping)].append(e)
    all_rewards = [e.reward for e in episodes]
    batch_std = statistics.stdev(all_rewards) if len(all_rewards) > 1 else 0.0
    out: dict[str, float] = {}
    zero = 0
    for members in groups.values():
        rewards = [e.reward for e in members]
        if len(members) < 2 or max(rewards) == min(rewards):
            zero += 1
            continue
        mean = statistics.fmean(rewards)
        std = {"group": statistics.stdev(rewards), "batch": batch_std, "none": None}[scale]
        for e in members:
            a = e.reward - mean
            out[e.session_id] = a if std is None else a / (std + STD_EPS)
    return out, len(groups), zero


def _trained_versions(seq: TrainingSequence) -> list[int | None]:
    trained = set(seq.trained_call_ids)
    return [v for cid, v in zip(seq.call_ids, seq.policy_versions, strict=True) if cid in trained]


def _is_stale(version: int | None, unversioned: bool, opts: SampleOptions) -> bool:
    if opts.current_version is None:
        return False
    if unversioned or version is None:
        return opts.staleness == "refuse"
    age = opts.current_version - version
    return age > 0 if opts.staleness == "refuse" else age > opts.max_staleness


def _temperatures(seq: TrainingSequence, by_id: Mapping[str, CallRecord]) -> tuple[float, ...]:
    temps = [1.0] * len(seq.input_ids)
    for cid in seq.trained_call_ids:
        r = by_id[cid]
        t = float(r.sampling_applied.get("temperature", 1.0) or 1.0)  # 0 = greedy: logprob 0, any scale works
        start = len(r.tokens.prompt_ids)
        temps[start : start + len(r.tokens.completion_ids)] = [t] * len(r.tokens.completion_ids)
    return tuple(temps)


def build_samples(episodes: Sequence[EpisodeRecord], records: Sequence[CallRecord], opts: SampleOptions) -> SampleSet:
    """Samples of one collect (see the module docstring)."""
    ran = [e for e in episodes if e.error is None]
    adv, n_groups, zero = advantages(ran, opts.grouping, opts.scale_rewards)
    by_session: dict[str, list[CallRecord]] = defaultdict(list)
    for r in records:
        by_session[r.session_id].append(r)
    counts: dict[str, int] = defaultdict(int)
    samples: list[Sample] = []
    for e in ran:
        session = by_session.get(e.session_id, [])
        by_id = {r.call_id: r for r in session}
        for seq in build_sequences(session) if session else []:
            counts["sequences"] += 1
            why = _drop_reason(seq, e, adv, opts)
            if why is not None:
                counts[why] += 1
                continue
            versions = _trained_versions(seq)
            known = [v for v in versions if v is not None]
            samples.append(
                Sample(
                    session_id=e.session_id,
                    group=group_key(e, opts.grouping),
                    harness=e.harness,
                    reward=e.reward,
                    advantage=adv[e.session_id],
                    weight=float(opts.harness_weights.get(e.harness, 1.0)),
                    input_ids=seq.input_ids,
                    loss_mask=seq.loss_mask,
                    behaviour_logprobs=seq.behaviour_logprobs,
                    temperatures=_temperatures(seq, by_id),
                    policy_version=min(known) if known else None,
                )
            )
    stats = SampleStats(
        episodes=len(episodes),
        errored_episodes=len(episodes) - len(ran),
        groups=n_groups,
        zero_variance_groups=zero,
        sequences=counts["sequences"],
        samples=len(samples),
        dropped_zero_variance=counts["dropped_zero_variance"],
        dropped_auxiliary=counts["dropped_auxiliary"],
        dropped_empty=counts["dropped_empty"],
        dropped_stale=counts["dropped_stale"],
        dropped_too_long=counts["dropped_too_long"],
        trained_tokens=sum(s.trained_tokens for s in samples),
    )
    return SampleSet(tuple(samples), stats, adv)


def _drop_reason(seq: TrainingSequence, e: EpisodeRecord, adv: Mapping[str, float], opts: SampleOptions) -> str | None:
    if seq.auxiliary and not opts.include_auxiliary:
        return "dropped_auxiliary"
    if not any(seq.loss_mask):
        return "dropped_empty"
    if e.session_id not in adv:
        return "dropped_zero_variance"
    if len(seq.input_ids) > opts.max_length:
        return "dropped_too_long"
    versions = _trained_versions(seq)
    known = [v for v in versions if v is not None]
    if _is_stale(min(known) if known else None, len(known) < len(versions), opts):
        return "dropped_stale"
    return None


def collect_metrics(episodes: Sequence[EpisodeRecord], zero_variance_groups: int) -> dict[str, float]:
    """The numeric part of a ``collect`` metrics row."""
    if not episodes:
        return {"episodes": 0.0, "zero_variance_groups": float(zero_variance_groups)}
    rewards = [e.reward for e in episodes]
    out: dict[str, float] = {
        "episodes": float(len(episodes)),
        "reward_mean": statistics.fmean(rewards),
        "reward_std": statistics.pstdev(rewards),
        "pass_at_1": statistics.fmean(float(e.verifier_passed) for e in episodes),
        "tool_calls_mean": statistics.fmean(e.stats.tool_call_count for e in episodes),
        "zero_variance_groups": float(zero_variance_groups),
    }
    by_harness: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for e in episodes:
        by_harness[e.harness].append(e)
    for h, eps in sorted(by_harness.items()):
        out[f"pass_at_1/{h}"] = statistics.fmean(float(e.verifier_passed) for e in eps)
        out[f"tool_calls_mean/{h}"] = statistics.fmean(e.stats.tool_call_count for e in eps)
        out[f"reward_mean/{h}"] = statistics.fmean(e.reward for e in eps)
    return out


def staleness_metrics(samples: Sequence[Sample], current_version: int) -> dict[str, float]:
    """The policy-version lag of the kept samples (``current_version - policy_version``): ``staleness_mean`` and
    ``staleness_max`` over the versioned samples (absent when there are none), and ``unversioned_samples``."""
    lags = [current_version - s.policy_version for s in samples if s.policy_version is not None]
    out = {"unversioned_samples": float(len(samples) - len(lags))}
    if lags:
        out |= {"staleness_mean": statistics.fmean(lags), "staleness_max": float(max(lags))}
    return out
