"""Episode records of a collection run: one typed row per rollout, their Parquet schema, and the run summary.

Contract
--------
* :class:`EpisodeRecord` is one rollout (task x harness x sample) as ``tasks.collect`` saw it: the harness run,
  the verifier verdict, the reward and its components, and what the capture records of its session say
  (:class:`CallStats`, built by :func:`call_stats`). ``session_id`` joins it to the call records.
* :data:`EPISODE_SCHEMA` is the explicit Arrow schema; its metadata carries :data:`EPISODE_SCHEMA_VERSION` (bump
  it on any change to the fields or their meaning). :func:`write_episodes` writes ``*.tmp`` then renames, so a
  reader never sees half a file; :func:`read_episodes` checks the version and returns records.
* :func:`judge` turns what a rollout ended with into the reward function's :class:`~tasks.rewards.EpisodeOutcome`
  (a time-out counts as a budget stop; a harness that could not run, or exited non-zero without a budget stop,
  crashed). :func:`rejoin` recounts every episode from the final call records and rescores those that changed.
* :func:`summarize` gives one :class:`SummaryRow` per harness plus ``all``: episodes, pass@1 (mean of
  ``verifier_passed``), mean reward, mean tool calls, mean calls, errors, and how many (task, harness) groups have
  rewards that differ (a group whose rewards are all equal gives GRPO no signal). :func:`summary_csv` and
  :func:`summary_markdown` render it; :func:`write_outputs` writes the episodes, both summaries and two bar charts
  into a run folder: pass@1 per harness with its 95% Wilson interval, and mean tool calls per episode per harness
  with its 95% Student's t interval (:func:`summary_figures`; the bars are the summary's own numbers).
* :class:`Progress` is the one-line progress bar of a run (in place on a terminal, a line per episode otherwise).

Layout: call statistics, the record and schema, Parquet I/O, scoring and the final join, the summary, outputs,
progress.
"""

from __future__ import annotations

import csv
import io
import os
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, TextIO

import pyarrow as pa
import pyarrow.parquet as pq

from addon.records.schema import CallRecord, read_records, records_from_table
from addon.records.sequences import validate_session
from tasks.rewards import EpisodeOutcome, Rewarder

if TYPE_CHECKING:  # matplotlib is imported only when a chart is drawn: the trainer imports this module too
    from matplotlib.figure import Figure

EPISODE_SCHEMA_VERSION: Final = 1
EPISODE_SCHEMA_VERSION_KEY: Final = b"harnessrl.episode_schema_version"
ALL: Final = "all"

# ------------------------------------------------------------------------------------------------ call statistics


@dataclass(frozen=True)
class CallStats:
    """What the capture records of one session say about the episode."""

    calls: int = 0
    sampled_calls: int = 0
    error_calls: int = 0
    tool_call_count: int = 0
    tool_call_names: tuple[str, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    policy_versions: tuple[int, ...] = ()
    budget_stop: str | None = None
    splices: int = 0
    forks: int = 0
    broken_edges: int = 0
    session_grade: str | None = None


def call_stats(records: Sequence[CallRecord]) -> CallStats:
    """Aggregate one session's call records (any order). An empty session gives zeros and no grade."""
    if not records:
        return CallStats()
    ordered = sorted(records, key=lambda r: r.call_index)
    report = validate_session(ordered)
    stops = [r.budget_stop for r in ordered if r.budget_stop is not None]
    return CallStats(
        calls=len(ordered),
        sampled_calls=sum(1 for r in ordered if r.sampled),
        error_calls=sum(1 for r in ordered if r.error is not None and not r.sampled),
        tool_call_count=sum(len(r.tool_call_names) for r in ordered),
        tool_call_names=tuple(name for r in ordered for name in r.tool_call_names),
        prompt_tokens=sum(len(r.tokens.prompt_ids) for r in ordered),
        completion_tokens=sum(len(r.tokens.completion_ids) for r in ordered),
        policy_versions=tuple(sorted({r.policy_version for r in ordered if r.policy_version is not None})),
        budget_stop=stops[0] if stops else None,
        # a splice: the call's prompt extends its parent's prompt + sampled ids (the token-faithful path)
        splices=sum(1 for r in ordered if r.parent_call_id is not None and r.fork_reason is None),
        forks=sum(count for _, count in report.forks),
        broken_edges=len(report.broken_edges),
        session_grade=report.grade,
    )


# ------------------------------------------------------------------------------------------------ record and schema


@dataclass(frozen=True)
class EpisodeRecord:
    """One rollout. ``error`` is set when the collector itself failed (the harness never ran to an end)."""

    run_id: str
    session_id: str
    task_id: str
    task_version: str
    harness: str
    harness_version: str
    group_id: str  # "<task>/<harness>": the GRPO group
    task_group_id: str  # "<task>": the same task across harnesses
    sample_index: int
    started_at: datetime
    reward: float
    reward_components: Mapping[str, float]
    verifier_passed: bool
    verifier_reward: float | None
    verifier_status: str | None
    verifier_output_tail: str
    exit_status: int | None
    timed_out: bool
    crashed: bool
    wall_s: float
    harness_s: float
    stderr_tail: str
    stats: CallStats = field(default_factory=CallStats)
    error: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "reward_components", MappingProxyType(dict(self.reward_components)))


_STATS_FIELDS: Final = tuple(f.name for f in fields(CallStats))
_TS = pa.timestamp("us", tz="UTC")
EPISODE_SCHEMA: Final = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("session_id", pa.string(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("task_version", pa.string(), nullable=False),
        pa.field("harness", pa.string(), nullable=False),
        pa.field("harness_version", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),
        pa.field("task_group_id", pa.string(), nullable=False),
        pa.field("sample_index", pa.int32(), nullable=False),
        pa.field("started_at", _TS, nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("reward_components", pa.map_(pa.string(), pa.float64()), nullable=False),
        pa.field("verifier_passed", pa.bool_(), nullable=False),
        pa.field("verifier_reward", pa.float64()),
        pa.field("verifier_status", pa.string()),
        pa.field("verifier_output_tail", pa.string(), nullable=False),
        pa.field("exit_status", pa.int32()),
        pa.field("timed_out", pa.bool_(), nullable=False),
        pa.field("crashed", pa.bool_(), nullable=False),
        pa.field("wall_s", pa.float64(), nullable=False),
        pa.field("harness_s", pa.float64(), nullable=False),
        pa.field("stderr_tail", pa.string(), nullable=False),
        pa.field("calls", pa.int32(), nullable=False),
        pa.field("sampled_calls", pa.int32(), nullable=False),
        pa.field("error_calls", pa.int32(), nullable=False),
        pa.field("tool_call_count", pa.int32(), nullable=False),
        pa.field("tool_call_names", pa.list_(pa.string()), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("policy_versions", pa.list_(pa.int64()), nullable=False),
        pa.field("budget_stop", pa.string()),
        pa.field("splices", pa.int32(), nullable=False),
        pa.field("forks", pa.int32(), nullable=False),
        pa.field("broken_edges", pa.int32(), nullable=False),
        pa.field("session_grade", pa.string()),
        pa.field("error", pa.string()),
    ],
    metadata={EPISODE_SCHEMA_VERSION_KEY: str(EPISODE_SCHEMA_VERSION).encode()},
)


def to_row(episode: EpisodeRecord) -> dict[str, Any]:
    row = {f.name: getattr(episode, f.name) for f in fields(EpisodeRecord) if f.name != "stats"}
    row |= {name: getattr(episode.stats, name) for name in _STATS_FIELDS}
    row["schema_version"] = EPISODE_SCHEMA_VERSION
    row["reward_components"] = list(episode.reward_components.items())
    return row


def from_row(row: Mapping[str, Any]) -> EpisodeRecord:
    stats = {k: row[k] for k in _STATS_FIELDS}
    stats["tool_call_names"] = tuple(row["tool_call_names"])
    stats["policy_versions"] = tuple(row["policy_versions"])
    own = {f.name: row[f.name] for f in fields(EpisodeRecord) if f.name != "stats"}
    own["reward_components"] = dict(row["reward_components"])
    return EpisodeRecord(**own, stats=CallStats(**stats))


# ------------------------------------------------------------------------------------------------ Parquet I/O


def write_episodes(path: Path, episodes: Sequence[EpisodeRecord]) -> int:
    """Write all episodes to ``path`` (zstd Parquet) through ``path.tmp`` + rename; returns the row count."""
    table = pa.Table.from_pylist([to_row(e) for e in episodes], schema=EPISODE_SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)
    return table.num_rows


def read_episodes(path: Path) -> list[EpisodeRecord]:
    """Read a file :func:`write_episodes` wrote; raises ``ValueError`` on another schema version."""
    table = pq.read_table(path)
    version = (table.schema.metadata or {}).get(EPISODE_SCHEMA_VERSION_KEY)
    if version != str(EPISODE_SCHEMA_VERSION).encode():
        raise ValueError(f"{path} has episode schema version {version!r}; expected {EPISODE_SCHEMA_VERSION}")
    return [from_row(row) for row in table.to_pylist()]


# ----------------------------------------------------------------------------------------- scoring and the final join


def judge(
    task_id: str,
    harness: str,
    verdict: tuple[float | None, bool],
    ended: tuple[int | None, bool] | None,
    stats: CallStats,
) -> EpisodeOutcome:
    """The reward function's view of an episode. ``verdict``: the verifier's (reward, passed); ``ended``: the
    harness's (exit status, timed out), None if it never ran. A time-out counts as a budget stop (time)."""
    reward, passed = verdict
    exit_status, timed_out = ended if ended is not None else (None, False)
    budget_stop = stats.budget_stop is not None or timed_out
    return EpisodeOutcome(
        task_id=task_id,
        harness=harness,
        verifier_reward=reward,
        verifier_passed=passed,
        tool_call_count=stats.tool_call_count,
        exit_status=exit_status,
        budget_stop=budget_stop,
        crashed=ended is None or (exit_status not in (0, None) and not budget_stop),
    )


def rejoin(episodes: Sequence[EpisodeRecord], records: Path, rewarder: Rewarder) -> list[EpisodeRecord]:
    """Recount every episode from the final call records (after the proxies stopped) and rescore those that changed.

    A call still streaming when its harness was killed (a time-out) is recorded only when it ends, after the
    rollout read its session; this final join catches it.
    """
    sessions: dict[str, list[CallRecord]] = defaultdict(list)
    if any(records.rglob("shard-*.parquet")):
        for rec in records_from_table(read_records(records)):
            sessions[rec.session_id].append(rec)
    out = []
    for e in episodes:
        stats = call_stats(sessions.get(e.session_id, []))
        if stats == e.stats:
            out.append(e)
            continue
        ended = None if e.error is not None else (e.exit_status, e.timed_out)
        outcome = judge(e.task_id, e.harness, (e.verifier_reward, e.verifier_passed), ended, stats)
        result = rewarder(outcome)
        out.append(replace(e, stats=stats, crashed=outcome.crashed, reward=result.reward,
                           reward_components=result.components))  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------------ summary


@dataclass(frozen=True)
class SummaryRow:
    harness: str  # a harness name, or "all"
    episodes: int
    pass_at_1: float
    mean_reward: float
    mean_tool_calls: float
    mean_calls: float
    errors: int  # collector errors and harness crashes
    groups: int
    varied_groups: int  # groups whose rewards are not all equal


def _row(name: str, eps: Sequence[EpisodeRecord]) -> SummaryRow:
    n = len(eps)
    groups: dict[str, set[float]] = defaultdict(set)
    for e in eps:
        groups[e.group_id].add(e.reward)
    return SummaryRow(
        harness=name,
        episodes=n,
        pass_at_1=sum(e.verifier_passed for e in eps) / n,
        mean_reward=sum(e.reward for e in eps) / n,
        mean_tool_calls=sum(e.stats.tool_call_count for e in eps) / n,
        mean_calls=sum(e.stats.calls for e in eps) / n,
        errors=sum(1 for e in eps if e.error is not None or e.crashed),
        groups=len(groups),
        varied_groups=sum(1 for rewards in groups.values() if len(rewards) > 1),
    )


def summarize(episodes: Sequence[EpisodeRecord]) -> list[SummaryRow]:
    """One row per harness (in first-seen order), then ``all``; empty input gives no rows."""
    if not episodes:
        return []
    by_harness: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for e in episodes:
        by_harness[e.harness].append(e)
    return [_row(h, eps) for h, eps in by_harness.items()] + [_row(ALL, episodes)]


_COLUMNS: Final = tuple(f.name for f in fields(SummaryRow))


def _cells(row: SummaryRow) -> list[str]:
    return [f"{v:.3f}" if isinstance(v, float) else str(v) for v in (getattr(row, c) for c in _COLUMNS)]


def summary_csv(rows: Sequence[SummaryRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(_COLUMNS)
    writer.writerows(_cells(r) for r in rows)
    return out.getvalue()


def summary_markdown(rows: Sequence[SummaryRow]) -> str:
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def task_markdown(episodes: Sequence[EpisodeRecord]) -> str:
    """Per task and harness: passes of episodes, pass rate with its 95% Wilson interval, mean reward. This is how
    a task set's difficulty is chosen by measurement (docs/tasks.md: a base pass rate between 5% and 50% gives a
    group of G rollouts reward variance); empty input gives an empty string."""
    from tasks.figures import wilson_interval

    if not episodes:
        return ""
    cells: dict[tuple[str, str], list[EpisodeRecord]] = defaultdict(list)
    for e in episodes:
        cells[(e.task_id, e.harness)].append(e)
    lines = ["| task | harness | passed / episodes | pass rate [95% interval] | mean reward |", "|---|---|---|---|---|"]
    for (task, harness), eps in sorted(cells.items()):
        k, n = sum(e.verifier_passed for e in eps), len(eps)
        low, high = wilson_interval(k, n) or (0.0, 1.0)
        reward = sum(e.reward for e in eps) / n
        lines.append(f"| {task} | {harness} | {k} / {n} | {k / n:.0%} [{low:.0%}, {high:.0%}] | {reward:.3f} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ outputs


def summary_figures(episodes: Sequence[EpisodeRecord], run: str = "") -> dict[str, Figure]:
    """``pass_at_1`` and ``tool_calls`` figures: one bar per harness (the :func:`summarize` value) with its 95%
    interval; empty input gives no charts. ``run`` names the run in the titles."""
    from tasks.figures import BarSeries, bar_figure, mean_interval, wilson_interval

    rows = [r for r in summarize(episodes) if r.harness != ALL]
    if not rows:
        return {}
    by_harness: dict[str, list[EpisodeRecord]] = defaultdict(list)
    for e in episodes:
        by_harness[e.harness].append(e)
    names = [r.harness for r in rows]
    n = {h: len(by_harness[h]) for h in names}
    tasks = len({e.task_id for e in episodes})
    on = f"{len(episodes)} episodes on {tasks} task{'s' * (tasks != 1)}" + (f", run {run}" if run else "")
    pass_ci = [wilson_interval(sum(e.verifier_passed for e in by_harness[h]), n[h]) for h in names]
    tool_ci = [mean_interval([e.stats.tool_call_count for e in by_harness[h]]) for h in names]
    tool_ci = [None if ci is None else (max(0.0, ci[0]), ci[1]) for ci in tool_ci]  # a count is never negative
    labels = [f"{h}\n(n={n[h]})" for h in names]
    pass_fig = bar_figure(
        f"pass@1 per harness\n{on}; error bars: 95% Wilson interval",
        labels,
        [BarSeries("pass@1", tuple(r.pass_at_1 for r in rows), tuple(pass_ci))],
        ylabel="pass@1 (fraction of episodes passed)",
        xlabel="harness (episodes)",
        ymax=1.0,
    )
    tool_fig = bar_figure(
        f"Mean tool calls per episode, per harness\n{on}; error bars: 95% t interval",
        labels,
        [BarSeries("mean tool calls", tuple(r.mean_tool_calls for r in rows), tuple(tool_ci))],
        ylabel="tool calls per episode",
        xlabel="harness (episodes)",
        value_format="{:.1f}",
    )
    return {"pass_at_1": pass_fig, "tool_calls": tool_fig}


def write_outputs(out: Path, episodes: Sequence[EpisodeRecord]) -> dict[str, Path]:
    """episodes.parquet, summary.csv, summary.md (the harness table, then :func:`task_markdown`) and the two bar
    charts (:func:`summary_figures`) under ``out``."""
    from tasks.figures import png

    rows = summarize(episodes)
    files = {"episodes": out / "episodes.parquet", "csv": out / "summary.csv", "markdown": out / "summary.md"}
    write_episodes(files["episodes"], episodes)
    files["csv"].write_text(summary_csv(rows))
    per_task = task_markdown(episodes)
    files["markdown"].write_text(summary_markdown(rows) + (f"\n## Per task\n\n{per_task}" if per_task else ""))
    for name, fig in summary_figures(episodes, out.name).items():
        files[name] = out / f"{name}.png"
        files[name].write_bytes(png(fig))
    return files


# ------------------------------------------------------------------------------------------------ progress


@dataclass
class Progress:
    """A one-line progress bar on ``stream``: done/total, pass rate, mean reward, elapsed and ETA."""

    total: int
    stream: TextIO
    width: int = 24
    done: int = 0
    passed: int = 0
    reward: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def update(self, ep: EpisodeRecord) -> None:
        self.done += 1
        self.passed += ep.verifier_passed
        self.reward += ep.reward
        self.stream.write(("\r" if self.stream.isatty() else "") + self.line())
        self.stream.write("" if self.stream.isatty() and self.done < self.total else "\n")
        self.stream.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = (now if now is not None else time.monotonic()) - self.started
        filled = self.width * self.done // max(1, self.total)
        rate = f"{100 * self.passed / self.done:.0f}%" if self.done else "-"
        mean = f"{self.reward / self.done:.2f}" if self.done else "-"
        eta = elapsed / self.done * (self.total - self.done) if self.done else None
        return (
            f"collect [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
            f"pass@1 {rate} reward {mean} elapsed {_clock(elapsed)} eta {_clock(eta)}"
        )


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"
