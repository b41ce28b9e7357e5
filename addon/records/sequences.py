"""Training sequences from the call records of one session: one token sequence per root-to-leaf path of the
prefix graph, with the loss on exactly the ids the model sampled.

Contract
--------
Imports only the standard library and :mod:`addon.records.schema` (pyarrow), so it runs in the proxy env and the engine
env alike.

* The prefix graph: a record *extends* its ``parent_call_id`` when it names a parent recorded earlier in the
  session, has no ``fork_reason``, neither is auxiliary, and — verified here, per edge — its ``prompt_ids`` start
  with the parent's ``prompt_ids + completion_ids``. An edge that fails the check is split (the child becomes a
  root) and reported in :attr:`SessionReport.broken_edges`. A link with a ``fork_reason`` is not an extension.
* :func:`build_sequences`: one :class:`TrainingSequence` per leaf, whose ``input_ids`` are the leaf's
  ``prompt_ids + completion_ids`` (valid because every call's prompt starts with its parent's prompt and
  completion). ``loss_mask`` is 1 exactly on sampled completion ids, 0 on prompts, tool results and template glue;
  ``behaviour_logprobs`` are the sampled ids' logprobs where the mask is 1 and 0 elsewhere. Each sampled call is
  trained in exactly one sequence: the first one (leaves in ``call_index`` order) that holds it; in the others it
  is masked. Auxiliary calls are roots of their own, marked ``auxiliary``. A call whose logprobs do not align with
  its ids (count differs, a value infinite or above 0), or that ended incomplete, is never trained. A NaN logprob
  marks one sampled token the engine gave no logprob for (:data:`addon.engine.client.MISSING_LOGPROB`): that token
  alone gets mask 0 (there is no behaviour logprob to take a ratio against); the rest of its call is trained.
* :func:`validate_session` grades a session (:class:`SessionReport`); :func:`merge_ratio` is the number of token
  ids in per-call rows over the number in the merged sequences.

Organisation: types; the lineage (graph) of a session; sequences; the report.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

from addon.records.schema import CallRecord

MaskReason: TypeAlias = Literal["misaligned_logprobs", "incomplete"]
Grade: TypeAlias = Literal["ok", "warn", "bad"]
LOGPROB_SLACK = 1e-4  # float32 rounding of a probability-1 token may print as a hair above 0


@dataclass(frozen=True)
class TrainingSequence:
    session_id: str
    call_ids: tuple[str, ...]  # the path, root to leaf
    trained_call_ids: tuple[str, ...]  # the calls whose completion carries loss here
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    auxiliary: bool
    policy_versions: tuple[int | None, ...]  # per call of the path

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        if len(self.loss_mask) != n or len(self.behaviour_logprobs) != n:
            raise ValueError(
                f"input_ids ({n}), loss_mask ({len(self.loss_mask)}) and behaviour_logprobs "
                f"({len(self.behaviour_logprobs)}) must have one entry per token"
            )


@dataclass(frozen=True)
class BrokenEdge:
    call_id: str
    parent_call_id: str
    why: Literal["parent_missing", "parent_later", "not_a_prefix"]


@dataclass(frozen=True)
class Lineage:
    """A session's calls in ``call_index`` order and the extension edges that hold."""

    records: tuple[CallRecord, ...]
    parent: dict[str, str]  # call id -> the call it extends
    broken: tuple[BrokenEdge, ...]

    @property
    def leaves(self) -> list[CallRecord]:
        extended = set(self.parent.values())
        return [r for r in self.records if r.call_id not in extended]

    def path(self, leaf: CallRecord) -> list[CallRecord]:
        by_id = {r.call_id: r for r in self.records}
        out = [leaf]
        while out[-1].call_id in self.parent:
            out.append(by_id[self.parent[out[-1].call_id]])
        return out[::-1]


def lineage(records: Sequence[CallRecord]) -> Lineage:
    """The prefix graph of one session's records, each extension edge verified on the token ids."""
    ordered = tuple(sorted(records, key=lambda r: r.call_index))
    sessions = {r.session_id for r in ordered}
    if len(sessions) > 1:
        raise ValueError(f"records of one session expected; got sessions {sorted(sessions)}")
    position = {r.call_id: i for i, r in enumerate(ordered)}
    if len(position) != len(ordered):
        raise ValueError("duplicate call_id in the session's records")
    parent: dict[str, str] = {}
    broken: list[BrokenEdge] = []
    for i, r in enumerate(ordered):
        pid = r.parent_call_id
        if pid is None or r.fork_reason is not None or r.auxiliary:
            continue
        if pid not in position:
            broken.append(BrokenEdge(r.call_id, pid, "parent_missing"))
            continue
        if position[pid] >= i:
            broken.append(BrokenEdge(r.call_id, pid, "parent_later"))
            continue
        p = ordered[position[pid]]
        if p.auxiliary:
            continue
        head = (*p.tokens.prompt_ids, *p.tokens.completion_ids)
        if r.tokens.prompt_ids[: len(head)] != head:
            broken.append(BrokenEdge(r.call_id, pid, "not_a_prefix"))
            continue
        parent[r.call_id] = pid
    return Lineage(ordered, parent, tuple(broken))


# ------------------------------------------------------------------------------------------------ sequences


def mask_reason(record: CallRecord) -> MaskReason | None:
    """Why a sampled call must not be trained, or None."""
    t = record.tokens
    if len(t.completion_logprobs) != len(t.completion_ids):
        return "misaligned_logprobs"
    if any(math.isinf(x) or x > LOGPROB_SLACK for x in t.completion_logprobs):  # NaN: one token masked, not all
        return "misaligned_logprobs"
    if record.incomplete:
        return "incomplete"
    return None


def build_sequences(records: Sequence[CallRecord]) -> list[TrainingSequence]:
    """One sequence per root-to-leaf path of one session's prefix graph (see the module docstring)."""
    graph = lineage(records)
    trained: set[str] = set()
    out: list[TrainingSequence] = []
    for leaf in graph.leaves:
        out.append(_sequence(graph.path(leaf), trained))
    return out


def _sequence(path: list[CallRecord], trained: set[str]) -> TrainingSequence:
    leaf = path[-1].tokens
    input_ids = (*leaf.prompt_ids, *leaf.completion_ids)
    mask = [0] * len(input_ids)
    logprobs = [0.0] * len(input_ids)
    here: list[str] = []
    for r in path:
        t = r.tokens
        if not t.completion_ids or r.call_id in trained or mask_reason(r) is not None:
            continue
        start = len(t.prompt_ids)
        mask[start : start + len(t.completion_ids)] = [0 if x != x else 1 for x in t.completion_logprobs]
        logprobs[start : start + len(t.completion_ids)] = [0.0 if x != x else x for x in t.completion_logprobs]
        trained.add(r.call_id)
        here.append(r.call_id)
    return TrainingSequence(
        session_id=path[0].session_id,
        call_ids=tuple(r.call_id for r in path),
        trained_call_ids=tuple(here),
        input_ids=input_ids,
        loss_mask=tuple(mask),
        behaviour_logprobs=tuple(logprobs),
        auxiliary=path[0].auxiliary,
        policy_versions=tuple(r.policy_version for r in path),
    )


def merge_ratio(records: Sequence[CallRecord], sequences: Sequence[TrainingSequence]) -> float:
    """Token ids in per-call rows (prompt + completion) over token ids in the merged sequences."""
    merged = sum(len(s.input_ids) for s in sequences)
    if merged == 0:
        raise ValueError("no tokens in the sequences")
    return sum(len(r.tokens.prompt_ids) + len(r.tokens.completion_ids) for r in records) / merged


# ------------------------------------------------------------------------------------------------ report


@dataclass(frozen=True)
class SessionReport:
    session_id: str
    calls: int
    auxiliary_calls: int
    sequences: int
    forks: tuple[tuple[str, int], ...]  # fork_reason -> count, most common first
    fork_ratio: float  # forks and broken edges per non-auxiliary call after the first
    broken_edges: tuple[BrokenEdge, ...]
    single_call: bool  # one non-auxiliary call where more were expected
    policy_version_changes: int  # between consecutive non-auxiliary calls
    masked: tuple[tuple[MaskReason, int], ...]  # sampled calls never trained, by reason
    grade: Grade
    problems: tuple[str, ...]
    missing_logprobs: int = 0  # sampled tokens without a logprob (NaN), each masked from training


def validate_session(
    records: Sequence[CallRecord], *, expected_calls: int = 2, max_fork_ratio: float = 0.25
) -> SessionReport:
    """Grade one session: ``bad`` (broken edges, misaligned logprobs), ``warn`` (many forks, a single call where
    ``expected_calls`` were expected, the policy changing mid-episode, incomplete calls) or ``ok``."""
    graph = lineage(records)
    main = [r for r in graph.records if not r.auxiliary]
    forks = Counter(r.fork_reason for r in main if r.fork_reason is not None)
    ratio = (sum(forks.values()) + len(graph.broken)) / max(1, len(main) - 1)
    versions = [r.policy_version for r in main if r.policy_version is not None]
    changes = sum(1 for a, b in zip(versions, versions[1:], strict=False) if a != b)
    masked = Counter(m for r in graph.records if r.tokens.completion_ids and (m := mask_reason(r)) is not None)
    single = len(main) == 1 and expected_calls > 1
    missing = sum(1 for r in graph.records for x in r.tokens.completion_logprobs if x != x)
    bad, warn = [], []
    if graph.broken:
        bad.append(f"{len(graph.broken)} parent links whose prompt does not extend the parent")
    if masked["misaligned_logprobs"]:
        bad.append(f"{masked['misaligned_logprobs']} calls with logprobs not aligned to their ids")
    if ratio > max_fork_ratio:
        warn.append(f"fork ratio {ratio:.2f} > {max_fork_ratio}")
    if single:
        warn.append(f"a single call where {expected_calls} or more were expected")
    if changes:
        warn.append(f"policy version changed {changes} times mid-episode")
    if masked["incomplete"]:
        warn.append(f"{masked['incomplete']} incomplete calls")
    if missing:
        warn.append(f"{missing} sampled tokens without a logprob (masked from training)")
    grade: Grade = "bad" if bad else "warn" if warn else "ok"
    return SessionReport(
        session_id=graph.records[0].session_id if graph.records else "",
        calls=len(graph.records),
        auxiliary_calls=len(graph.records) - len(main),
        sequences=len(graph.leaves),
        forks=tuple((str(k), v) for k, v in forks.most_common()),
        fork_ratio=ratio,
        broken_edges=graph.broken,
        single_call=single,
        policy_version_changes=changes,
        masked=tuple(masked.most_common()),
        grade=grade,
        problems=tuple(bad + warn),
        missing_logprobs=missing,
    )
