"""The before/after comparison of two sets of episodes: the cross-harness table (pass@1, mean reward, tool calls
per harness with 95% intervals), the transfer from the trained harnesses to the others, and the shaping effect.

Contract
--------
* :func:`compare` (pure): one :class:`HarnessComparison` per harness (first-seen order), then ``all``. Each side
  (:class:`Side`) holds the episodes, pass@1 (mean of ``verifier_passed``) with its 95% Wilson interval, and the
  mean reward and mean tool calls with their 95% Student's t intervals (:mod:`tasks.figures`' interval functions;
  None below two episodes). :meth:`HarnessComparison.change` is after - before with a 95% interval by
  :func:`difference` (MOVER, Zou & Donner 2008: the two sides' own intervals combined, which for two Wilson
  intervals is Newcombe's hybrid score interval). ``trained`` marks the harnesses the checkpoint was trained on.
  Collector errors count as failures with their reward and tool calls. The shaping effect: among the (task,
  harness) pairs solved (at least one passing episode) both before and after, the mean tool calls of their passing
  episodes before and after and the relative change.
* :func:`transfer` (pure; None without trained harnesses): the episodes of the trained harnesses pooled into one
  row and those of the other harnesses into another, and :meth:`Transfer.gap` = change on the trained harnesses -
  change on the others, with its MOVER interval (the pooled episodes of the two groups are disjoint).
* :func:`write_comparison` writes :data:`COMPARISON_FILES` into a folder: ``comparison.md``
  (:func:`comparison_markdown`: the cross-harness table, the transfer table when trained harnesses are known, the
  shaping table), ``comparison.json`` (:func:`comparison_json`, the same numbers) and four PNG bar charts
  (:func:`comparison_figures`): ``pass_at_1``, ``reward`` and ``tool_calls`` (a before and an after bar per
  harness with its interval) and ``change`` (after - before of pass@1 and mean reward per harness, trained ones
  marked, then the pooled trained and other groups). No rows (no episode on either side) is an error.
* :func:`compare_dirs` is the ``compare`` command of :mod:`trainer.evaluate`: two collect run dirs' episodes in,
  the comparison out. :func:`eval_metrics_row` turns the rows into a ``phase: eval`` row of ``metrics.jsonl``.

Nothing here runs a model; :mod:`trainer.evaluate` collects the episodes and re-exports every public name of this
module.

Layout: comparison (sides, changes, rows, transfer), tables, JSON, figures, the files, metrics row, ``compare``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from matplotlib.figure import Figure

from tasks.episodes import ALL, EpisodeRecord, read_episodes
from tasks.figures import BarSeries, Interval, bar_figure, mean_interval, png, wilson_interval

COMPARISON_FILES: Final = (
    "comparison.md", "comparison.json", "pass_at_1.png", "reward.png", "tool_calls.png", "change.png",
)  # fmt: skip
METRICS: Final = ("pass_at_1", "reward", "tool_calls")  # the Side fields that have an interval (<name>_ci)
TRAINED, OTHER = "trained", "other"  # the pooled rows of a Transfer

# ------------------------------------------------------------------------------------------------ comparison


@dataclass(frozen=True)
class Side:
    """One harness's figures in one run (None where it has no episode; an interval is None below its minimum:
    one episode for Wilson, two for t)."""

    episodes: int
    pass_at_1: float | None
    tool_calls: float | None
    reward: float | None = None
    pass_at_1_ci: Interval | None = None
    reward_ci: Interval | None = None
    tool_calls_ci: Interval | None = None


@dataclass(frozen=True)
class Change:
    """after - before, and its 95% interval (None where a side has no interval)."""

    value: float
    interval: Interval | None


def difference(before: float | None, before_ci: Interval | None, after: float | None,
               after_ci: Interval | None) -> Change | None:  # fmt: skip
    """``after - before`` with the MOVER interval built from the two (independent) estimates' own intervals:
    ``d - sqrt((a - l_a)^2 + (u_b - b)^2)`` to ``d + sqrt((u_a - a)^2 + (b - l_b)^2)``. None without both values."""
    if before is None or after is None:
        return None
    d = after - before
    if before_ci is None or after_ci is None:
        return Change(d, None)
    (lb, ub), (la, ua) = before_ci, after_ci
    return Change(d, (d - math.hypot(after - la, ub - before), d + math.hypot(ua - after, before - lb)))


@dataclass(frozen=True)
class HarnessComparison:
    harness: str  # a harness name, "all", or (in a Transfer) "trained" / "other"
    before: Side
    after: Side
    solved_both: int  # (task, harness) pairs with a passing episode before and after
    shaped_tool_calls_before: float | None  # mean tool calls of those pairs' passing episodes
    shaped_tool_calls_after: float | None
    trained: bool = False  # the checkpoint was trained on this harness

    @property
    def tool_call_change(self) -> float | None:
        """Relative change of the shaped tool calls (after / before - 1); None without a base to divide by."""
        b, a = self.shaped_tool_calls_before, self.shaped_tool_calls_after
        return None if b is None or a is None or b == 0 else a / b - 1.0

    def change(self, metric: str) -> Change | None:
        """after - before of one of :data:`METRICS`, with its 95% interval (:func:`difference`)."""
        b, a = self.before, self.after
        return difference(
            getattr(b, metric), getattr(b, f"{metric}_ci"), getattr(a, metric), getattr(a, f"{metric}_ci")
        )


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _side(eps: Sequence[EpisodeRecord]) -> Side:
    rewards = [float(e.reward) for e in eps]
    tools = [float(e.stats.tool_call_count) for e in eps]
    return Side(
        episodes=len(eps),
        pass_at_1=_mean([float(e.verifier_passed) for e in eps]),
        tool_calls=_mean(tools),
        reward=_mean(rewards),
        pass_at_1_ci=wilson_interval(sum(e.verifier_passed for e in eps), len(eps)),
        reward_ci=mean_interval(rewards),
        tool_calls_ci=mean_interval(tools),
    )


def _solved(eps: Sequence[EpisodeRecord]) -> dict[tuple[str, str], list[EpisodeRecord]]:
    out: dict[tuple[str, str], list[EpisodeRecord]] = defaultdict(list)
    for e in eps:
        if e.verifier_passed:
            out[(e.task_id, e.harness)].append(e)
    return out


def _row(name: str, before: Sequence[EpisodeRecord], after: Sequence[EpisodeRecord],
         trained: bool = False) -> HarnessComparison:  # fmt: skip
    solved_b, solved_a = _solved(before), _solved(after)
    both = sorted(set(solved_b) & set(solved_a))
    return HarnessComparison(
        harness=name,
        before=_side(before),
        after=_side(after),
        solved_both=len(both),
        shaped_tool_calls_before=_mean([e.stats.tool_call_count for k in both for e in solved_b[k]]),
        shaped_tool_calls_after=_mean([e.stats.tool_call_count for k in both for e in solved_a[k]]),
        trained=trained,
    )


def compare(before: Sequence[EpisodeRecord], after: Sequence[EpisodeRecord],
            trained: Collection[str] = ()) -> list[HarnessComparison]:  # fmt: skip
    """One row per harness seen on either side (first-seen order; ``trained`` ones marked), then ``all``."""
    harnesses = list(dict.fromkeys(e.harness for e in [*before, *after]))
    rows = [
        _row(h, [e for e in before if e.harness == h], [e for e in after if e.harness == h], h in trained)
        for h in harnesses
    ]
    return rows + [_row(ALL, before, after)] if rows else []


@dataclass(frozen=True)
class Transfer:
    """The trained harnesses' episodes pooled (``trained``) against the other harnesses' (``other``; None when
    every evaluated harness was trained)."""

    trained_harnesses: tuple[str, ...]
    other_harnesses: tuple[str, ...]
    trained: HarnessComparison
    other: HarnessComparison | None

    def gap(self, metric: str) -> Change | None:
        """(change on the trained harnesses) - (change on the others), with its MOVER interval."""
        t = self.trained.change(metric)
        o = self.other.change(metric) if self.other is not None else None
        if t is None or o is None:
            return None
        return difference(o.value, o.interval, t.value, t.interval)


def transfer(before: Sequence[EpisodeRecord], after: Sequence[EpisodeRecord],
             trained: Collection[str]) -> Transfer | None:  # fmt: skip
    """The pooled trained / other rows (see :class:`Transfer`); None when no harness is named as trained."""
    if not trained:
        return None
    seen = list(dict.fromkeys(e.harness for e in [*before, *after]))
    others = tuple(h for h in seen if h not in trained)

    def pick(eps: Sequence[EpisodeRecord], names: Collection[str]) -> list[EpisodeRecord]:
        return [e for e in eps if e.harness in names]

    return Transfer(
        trained_harnesses=tuple(trained),
        other_harnesses=others,
        trained=_row(TRAINED, pick(before, trained), pick(after, trained), True),
        other=_row(OTHER, pick(before, others), pick(after, others)) if others else None,
    )


# ------------------------------------------------------------------------------------------------ tables

COLUMNS: Final = (
    "harness", "trained", "episodes before", "episodes after", "pass@1 before", "pass@1 after", "Δ pass@1",
    "mean reward before", "mean reward after", "Δ mean reward", "tool calls before", "tool calls after",
    "Δ tool calls",
)  # fmt: skip
TRANSFER_COLUMNS: Final = (
    "group", "harnesses", "episodes before", "episodes after", "Δ pass@1", "Δ mean reward", "Δ tool calls",
)  # fmt: skip
SHAPING_COLUMNS: Final = ("harness", "solved both", "tool calls (solved both) before", "after", "change")


def _fmt(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.0%}" if pct else f"{value:.3f}"


def _estimate(value: float | None, ci: Interval | None) -> str:
    """``0.500 [0.150, 0.850]``; the value alone without an interval; ``-`` without a value."""
    return _fmt(value) + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if value is not None and ci is not None else "")


def _change(c: Change | None) -> str:
    if c is None:
        return "-"
    return f"{c.value:+.3f}" + (f" [{c.interval[0]:+.3f}, {c.interval[1]:+.3f}]" if c.interval else "")


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(r) + " |" for r in rows),
    ]


def _cross_row(r: HarnessComparison, known: bool) -> list[str]:
    b, a = r.before, r.after
    return [
        r.harness, ("yes" if r.trained else "no") if known and r.harness != ALL else "-", str(b.episodes),
        str(a.episodes), _estimate(b.pass_at_1, b.pass_at_1_ci), _estimate(a.pass_at_1, a.pass_at_1_ci),
        _change(r.change("pass_at_1")), _estimate(b.reward, b.reward_ci), _estimate(a.reward, a.reward_ci),
        _change(r.change("reward")), _estimate(b.tool_calls, b.tool_calls_ci),
        _estimate(a.tool_calls, a.tool_calls_ci), _change(r.change("tool_calls")),
    ]  # fmt: skip


def _transfer_rows(t: Transfer) -> list[list[str]]:
    out = []
    for r, names in ((t.trained, t.trained_harnesses), (t.other, t.other_harnesses)):
        if r is not None:
            cells = [r.harness, ", ".join(names), str(r.before.episodes), str(r.after.episodes)]
            out.append(cells + [_change(r.change(m)) for m in METRICS])
    return out + [["trained − other", "", "-", "-", *(_change(t.gap(m)) for m in METRICS)]]


def comparison_markdown(rows: Sequence[HarnessComparison], labels: tuple[str, str] = ("before", "after"),
                        tasks: str = "", moved: Transfer | None = None) -> str:  # fmt: skip
    """The three tables of ``comparison.md`` (see the module docstring); ``moved``: the :func:`transfer`."""
    head = (f"Tasks: {tasks}.\n" if tasks else "") + f"Before: {labels[0]}. After: {labels[1]}.\n"
    parts = [
        head,
        "## Cross-harness table\n",
        "Per harness, the same tasks before and after. 95% intervals in brackets: Wilson for pass@1, Student's t "
        "for the means; Δ = after − before with its MOVER interval (Newcombe's for pass@1)."
        + ("" if moved else " Trained harnesses unknown: give the training run or --trained-harnesses.")
        + "\n",
        "\n".join(_table(COLUMNS, [_cross_row(r, moved is not None) for r in rows])) + "\n",
    ]
    if moved is not None:
        parts += [
            "## Transfer\n",
            "The episodes of the trained harnesses pooled against those of the others; trained − other is the "
            "difference of the two changes (positive: the training helped most where it was trained).\n",
            "\n".join(_table(TRANSFER_COLUMNS, _transfer_rows(moved))) + "\n",
        ]
    shaping = [
        [r.harness, str(r.solved_both), _fmt(r.shaped_tool_calls_before), _fmt(r.shaped_tool_calls_after),
         _fmt(r.tool_call_change, pct=True)]
        for r in rows
    ]  # fmt: skip
    parts += [
        "## Shaping effect\n",
        "Mean tool calls of the passing episodes of the (task, harness) pairs solved both before and after; "
        "change = after / before - 1.\n",
        "\n".join(_table(SHAPING_COLUMNS, shaping)) + "\n",
    ]
    return "\n".join(parts)


# ------------------------------------------------------------------------------------------------ JSON


def _row_json(r: HarnessComparison) -> dict[str, Any]:
    changes = {m: None if (c := r.change(m)) is None else asdict(c) for m in METRICS}
    return asdict(r) | {"tool_call_change": r.tool_call_change, "change": changes}


def comparison_json(rows: Sequence[HarnessComparison], labels: tuple[str, str],
                    moved: Transfer | None = None) -> dict[str, Any]:  # fmt: skip
    body: dict[str, Any] = {"labels": {"before": labels[0], "after": labels[1]}, "rows": [_row_json(r) for r in rows]}
    body["transfer"] = None
    if moved is not None:
        body["transfer"] = {
            "trained_harnesses": list(moved.trained_harnesses),
            "other_harnesses": list(moved.other_harnesses),
            "trained": _row_json(moved.trained),
            "other": None if moved.other is None else _row_json(moved.other),
            "gap": {m: None if (g := moved.gap(m)) is None else asdict(g) for m in METRICS},
        }
    return body


# ------------------------------------------------------------------------------------------------ figures


def _short(text: str, chars: int = 60) -> str:
    """``text`` cut to ``chars``: a path in it keeps its last two parts, and then the end is kept."""
    if len(text) <= chars:
        return text
    words = [("…/" + "/".join(Path(w).parts[-2:])) if w.count("/") > 2 else w for w in text.split(" ")]
    short = " ".join(words)
    return short if len(short) <= chars else "…" + short[-(chars - 1) :]


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _side_series(rows: Sequence[HarnessComparison], metric: str, labels: tuple[str, str]) -> list[BarSeries]:
    """A before and an after series of one metric, each bar with its side's interval (a count's clipped at 0)."""
    out = []
    for name, label in zip(("before", "after"), labels, strict=True):
        sides = [r.before if name == "before" else r.after for r in rows]
        cis = [getattr(s, f"{metric}_ci") for s in sides]
        if metric == "tool_calls":  # a count is never negative
            cis = [None if ci is None else (max(0.0, ci[0]), ci[1]) for ci in cis]
        out.append(BarSeries(f"{name}: {_short(label)}", tuple(_nan(getattr(s, metric)) for s in sides), tuple(cis)))
    return out


def _change_figure(rows: Sequence[HarnessComparison], moved: Transfer | None, on: str) -> Figure:
    groups = [*rows] + ([moved.trained] + ([moved.other] if moved.other else []) if moved else [])
    names = [f"{r.harness} (trained)" if r.trained and r.harness != TRAINED else r.harness for r in groups]
    names = [f"{n} (pooled)" if r.harness in (TRAINED, OTHER) else n for n, r in zip(names, groups, strict=True)]
    series = []
    for metric, label in (("pass_at_1", "Δ pass@1"), ("reward", "Δ mean reward")):
        changes = [r.change(metric) for r in groups]
        values = tuple(math.nan if c is None else c.value for c in changes)
        series.append(BarSeries(label, values, tuple(None if c is None else c.interval for c in changes)))
    fig = bar_figure(
        f"Change after − before training, per harness\n{on}error bars: 95% MOVER interval",
        names, series, ylabel="after − before", xlabel="harness", value_format="{:+.2f}",
    )  # fmt: skip
    lows = [iv[0] for s in series for iv in s.intervals if iv is not None]
    ax = fig.axes[0]
    bottom, top = ax.get_ylim()
    ax.set_ylim(min(bottom, min(lows, default=0.0) * 1.12), top)  # bar_figure sizes the axis to the tops only
    return fig


def comparison_figures(rows: Sequence[HarnessComparison], labels: tuple[str, str] = ("before", "after"),
                       tasks: str = "", moved: Transfer | None = None) -> dict[str, Figure]:  # fmt: skip
    """``pass_at_1``, ``reward``, ``tool_calls``: a before and an after bar per harness (the rows' values) with the
    95% interval of each; a harness absent on one side has no bar there (``n/a``). ``change``: after - before of
    pass@1 and mean reward per harness (trained ones marked), then the pooled trained / other groups."""
    per = [r for r in rows if r.harness != ALL]
    harnesses = [r.harness for r in per]
    on = f"{_short(tasks, 100)}; " if tasks else ""
    return {
        "pass_at_1": bar_figure(
            f"pass@1 before vs after training, per harness\n{on}error bars: 95% Wilson interval",
            harnesses, _side_series(per, "pass_at_1", labels), ylabel="pass@1 (fraction of episodes passed)",
            xlabel="harness", ymax=1.0,
        ),
        "reward": bar_figure(
            f"Mean reward per episode before vs after training, per harness\n{on}error bars: 95% t interval",
            harnesses, _side_series(per, "reward", labels), ylabel="mean reward per episode", xlabel="harness",
        ),
        "tool_calls": bar_figure(
            f"Mean tool calls per episode before vs after training, per harness\n{on}error bars: 95% t interval",
            harnesses, _side_series(per, "tool_calls", labels), ylabel="tool calls per episode", xlabel="harness",
            value_format="{:.1f}",
        ),
        "change": _change_figure(per, moved, on),
    }  # fmt: skip


# ------------------------------------------------------------------------------------------------ files, commands


def write_comparison(out: Path, before: Sequence[EpisodeRecord], after: Sequence[EpisodeRecord],
                     labels: tuple[str, str], tasks: str = "",
                     trained: Collection[str] = ()) -> list[HarnessComparison]:  # fmt: skip
    """:data:`COMPARISON_FILES` under ``out``; returns the rows."""
    rows = compare(before, after, trained)
    if not rows:
        raise ValueError("no episodes on either side: nothing to compare")
    moved = transfer(before, after, trained)
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(comparison_markdown(rows, labels, tasks, moved))
    (out / "comparison.json").write_text(json.dumps(comparison_json(rows, labels, moved), indent=2) + "\n")
    for name, fig in comparison_figures(rows, labels, tasks, moved).items():
        (out / f"{name}.png").write_bytes(png(fig))
    return rows


def eval_metrics_row(iteration: int, wall_s: float, rows: Sequence[HarnessComparison]) -> dict[str, Any]:
    """A ``phase: eval`` row of metrics.jsonl: pass@1, mean reward and tool calls, before and after, overall and
    per harness."""
    row: dict[str, Any] = {"iteration": iteration, "phase": "eval", "step": None, "wall_s": round(wall_s, 3)}
    for r in rows:
        suffix = "" if r.harness == ALL else f"/{r.harness}"
        for name, side in (("before", r.before), ("after", r.after)):
            keys = (("pass_at_1", side.pass_at_1), ("reward_mean", side.reward), ("tool_calls_mean", side.tool_calls))
            for key, value in keys:
                if value is not None and math.isfinite(value):
                    row[f"{key}_{name}{suffix}"] = value
    return row


def compare_dirs(before: Path, after: Path, out: Path, trained: Collection[str] = ()) -> list[HarnessComparison]:
    """The ``compare`` command: read two collect run dirs' episodes and write the comparison."""
    return write_comparison(
        out, read_episodes(before / "episodes.parquet"), read_episodes(after / "episodes.parquet"),
        (str(before), str(after)), trained=trained,
    )  # fmt: skip
