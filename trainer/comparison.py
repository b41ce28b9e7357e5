"""The before/after comparison of two sets of episodes: pass@1, mean tool calls and the shaping effect per harness.

Contract
--------
* :func:`compare` (pure): one :class:`HarnessComparison` per harness (first-seen order), then ``all``: episodes,
  pass@1 (mean of ``verifier_passed``) and mean tool calls before and after, and the shaping effect: among the
  (task, harness) pairs solved (at least one passing episode) both before and after, the mean tool calls of their
  passing episodes before and after and the relative change. Collector errors count as failures with their tool
  calls.
* :func:`write_comparison` writes :data:`COMPARISON_FILES` into a folder: ``comparison.md`` (the table,
  :func:`comparison_markdown`), ``comparison.json`` (:func:`comparison_json`) and two PNG bar charts
  (``pass_at_1.png``, ``tool_calls.png``: before/after bars per harness with 95% intervals, Wilson for pass@1 and
  Student's t for the mean; :func:`comparison_figures`). No rows (no episode on either side) is an error.
* :func:`compare_dirs` is the ``compare`` command of :mod:`trainer.evaluate`: two collect run dirs' episodes in,
  the comparison out. :func:`eval_metrics_row` turns the rows into a ``phase: eval`` row of ``metrics.jsonl``.

Nothing here runs a model; :mod:`trainer.evaluate` collects the episodes and re-exports every public name of this
module.

Layout: comparison (the rows), outputs (table, JSON, figures, the files, metrics row, the ``compare`` command).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from matplotlib.figure import Figure

from tasks.episodes import ALL, EpisodeRecord, read_episodes
from tasks.figures import BarSeries, Interval, bar_figure, mean_interval, png, wilson_interval

COMPARISON_FILES: Final = ("comparison.md", "comparison.json", "pass_at_1.png", "tool_calls.png")

# ------------------------------------------------------------------------------------------------ comparison


@dataclass(frozen=True)
class Side:
    """One harness's figures in one run (None where it has no episode)."""

    episodes: int
    pass_at_1: float | None
    tool_calls: float | None


@dataclass(frozen=True)
class HarnessComparison:
    harness: str  # a harness name or "all"
    before: Side
    after: Side
    solved_both: int  # (task, harness) pairs with a passing episode before and after
    shaped_tool_calls_before: float | None  # mean tool calls of those pairs' passing episodes
    shaped_tool_calls_after: float | None

    @property
    def tool_call_change(self) -> float | None:
        """Relative change of the shaped tool calls (after / before - 1); None without a base to divide by."""
        b, a = self.shaped_tool_calls_before, self.shaped_tool_calls_after
        return None if b is None or a is None or b == 0 else a / b - 1.0


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _side(eps: Sequence[EpisodeRecord]) -> Side:
    return Side(
        len(eps),
        _mean([float(e.verifier_passed) for e in eps]),
        _mean([float(e.stats.tool_call_count) for e in eps]),
    )


def _solved(eps: Sequence[EpisodeRecord]) -> dict[tuple[str, str], list[EpisodeRecord]]:
    out: dict[tuple[str, str], list[EpisodeRecord]] = defaultdict(list)
    for e in eps:
        if e.verifier_passed:
            out[(e.task_id, e.harness)].append(e)
    return out


def _row(name: str, before: Sequence[EpisodeRecord], after: Sequence[EpisodeRecord]) -> HarnessComparison:
    solved_b, solved_a = _solved(before), _solved(after)
    both = sorted(set(solved_b) & set(solved_a))
    return HarnessComparison(
        harness=name,
        before=_side(before),
        after=_side(after),
        solved_both=len(both),
        shaped_tool_calls_before=_mean([e.stats.tool_call_count for k in both for e in solved_b[k]]),
        shaped_tool_calls_after=_mean([e.stats.tool_call_count for k in both for e in solved_a[k]]),
    )


def compare(before: Sequence[EpisodeRecord], after: Sequence[EpisodeRecord]) -> list[HarnessComparison]:
    """One row per harness seen on either side (first-seen order), then ``all``."""
    harnesses = list(dict.fromkeys(e.harness for e in [*before, *after]))
    rows = [_row(h, [e for e in before if e.harness == h], [e for e in after if e.harness == h]) for h in harnesses]
    return rows + [_row(ALL, before, after)] if rows else []


# ------------------------------------------------------------------------------------------------ outputs

COLUMNS: Final = (
    "harness", "episodes before", "episodes after", "pass@1 before", "pass@1 after", "tool calls before",
    "tool calls after", "solved both", "tool calls (solved both) before", "after", "change",
)  # fmt: skip


def _fmt(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.0%}" if pct else f"{value:.3f}"


def comparison_markdown(
    rows: Sequence[HarnessComparison], labels: tuple[str, str] = ("before", "after"), tasks: str = ""
) -> str:
    head = (f"Tasks: {tasks}.\n" if tasks else "") + f"Before: {labels[0]}. After: {labels[1]}.\n\n"
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [
            r.harness, str(r.before.episodes), str(r.after.episodes), _fmt(r.before.pass_at_1),
            _fmt(r.after.pass_at_1), _fmt(r.before.tool_calls), _fmt(r.after.tool_calls), str(r.solved_both),
            _fmt(r.shaped_tool_calls_before), _fmt(r.shaped_tool_calls_after), _fmt(r.tool_call_change, pct=True),
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    note = (
        "\nShaping effect: mean tool calls of the passing episodes of the (task, harness) pairs solved both before "
        "and after; change = after / before - 1.\n"
    )
    return head + "\n".join(lines) + "\n" + note


def comparison_json(rows: Sequence[HarnessComparison], labels: tuple[str, str]) -> dict[str, Any]:
    return {
        "labels": {"before": labels[0], "after": labels[1]},
        "rows": [asdict(r) | {"tool_call_change": r.tool_call_change} for r in rows],
    }


def _short(text: str, chars: int = 60) -> str:
    """``text`` cut to ``chars``: a path in it keeps its last two parts, and then the end is kept."""
    if len(text) <= chars:
        return text
    words = [("…/" + "/".join(Path(w).parts[-2:])) if w.count("/") > 2 else w for w in text.split(" ")]
    short = " ".join(words)
    return short if len(short) <= chars else "…" + short[-(chars - 1) :]


def comparison_figures(
    rows: Sequence[HarnessComparison],
    before: Sequence[EpisodeRecord],
    after: Sequence[EpisodeRecord],
    labels: tuple[str, str] = ("before", "after"),
    tasks: str = "",
) -> dict[str, Figure]:
    """``pass_at_1`` and ``tool_calls``: a before and an after bar per harness (the rows' values), with the 95%
    interval of each from its episodes; a harness absent on one side has no bar there (``n/a``)."""
    harnesses = [r.harness for r in rows if r.harness != ALL]
    sides = [(before, labels[0], "before", 0), (after, labels[1], "after", 1)]
    on = f"{_short(tasks, 100)}; " if tasks else ""

    def series(pick: str, interval: Any) -> list[BarSeries]:
        out = []
        for eps, label, name, i in sides:
            values = [getattr(r.before if i == 0 else r.after, pick) for r in rows if r.harness != ALL]
            cis: list[Interval | None] = [interval([e for e in eps if e.harness == h]) for h in harnesses]
            out.append(
                BarSeries(
                    f"{name}: {_short(label)}",
                    tuple(math.nan if v is None else v for v in values),
                    tuple(cis),
                )
            )
        return out

    def pass_ci(eps: Sequence[EpisodeRecord]) -> Interval | None:
        return wilson_interval(sum(e.verifier_passed for e in eps), len(eps))

    def tool_ci(eps: Sequence[EpisodeRecord]) -> Interval | None:
        ci = mean_interval([e.stats.tool_call_count for e in eps])
        return None if ci is None else (max(0.0, ci[0]), ci[1])  # a count is never negative

    return {
        "pass_at_1": bar_figure(
            f"pass@1 before vs after training, per harness\n{on}error bars: 95% Wilson interval",
            harnesses,
            series("pass_at_1", pass_ci),
            ylabel="pass@1 (fraction of episodes passed)",
            xlabel="harness",
            ymax=1.0,
        ),
        "tool_calls": bar_figure(
            f"Mean tool calls per episode before vs after training, per harness\n{on}error bars: 95% t interval",
            harnesses,
            series("tool_calls", tool_ci),
            ylabel="tool calls per episode",
            xlabel="harness",
            value_format="{:.1f}",
        ),
    }


def write_comparison(
    out: Path,
    before: Sequence[EpisodeRecord],
    after: Sequence[EpisodeRecord],
    labels: tuple[str, str],
    tasks: str = "",
) -> list[HarnessComparison]:
    """:data:`COMPARISON_FILES` under ``out``; returns the rows."""
    rows = compare(before, after)
    if not rows:
        raise ValueError("no episodes on either side: nothing to compare")
    out.mkdir(parents=True, exist_ok=True)
    (out / "comparison.md").write_text(comparison_markdown(rows, labels, tasks))
    (out / "comparison.json").write_text(json.dumps(comparison_json(rows, labels), indent=2) + "\n")
    for name, fig in comparison_figures(rows, before, after, labels, tasks).items():
        (out / f"{name}.png").write_bytes(png(fig))
    return rows


def eval_metrics_row(iteration: int, wall_s: float, rows: Sequence[HarnessComparison]) -> dict[str, Any]:
    """A ``phase: eval`` row of metrics.jsonl: pass@1 and tool calls, before and after, overall and per harness."""
    row: dict[str, Any] = {"iteration": iteration, "phase": "eval", "step": None, "wall_s": round(wall_s, 3)}
    for r in rows:
        suffix = "" if r.harness == ALL else f"/{r.harness}"
        for name, side in (("before", r.before), ("after", r.after)):
            for key, value in (("pass_at_1", side.pass_at_1), ("tool_calls_mean", side.tool_calls)):
                if value is not None and math.isfinite(value):
                    row[f"{key}_{name}{suffix}"] = value
    return row


def compare_dirs(before: Path, after: Path, out: Path) -> list[HarnessComparison]:
    """The ``compare`` command: read two collect run dirs' episodes and write the comparison."""
    return write_comparison(
        out, read_episodes(before / "episodes.parquet"), read_episodes(after / "episodes.parquet"),
        (str(before), str(after)),
    )  # fmt: skip
