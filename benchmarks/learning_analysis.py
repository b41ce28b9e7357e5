"""The controlled learning benchmark's figures: treatment against control, per seed, with 95% intervals.

Contract
--------
Pure: episodes in, estimates, a Markdown page and a figure out (no engine, no I/O but what the caller writes).

The unit of replication is the seed. A seed's **treatment** and **control** runs collect the same schedule with the
same collect seed (so their first iteration samples alike); the treatment updates the weights after each collect,
the control does not (learning rate 0). Both are evaluated on **held-out** tasks after their last iteration, and the
base model once per seed before.

* :func:`curve`: per iteration, the mean training reward of each seed's run of an arm, then the mean over seeds with
  its t-interval (n = seeds).
* :func:`heldout`: an arm's held-out pass@1 or mean reward before (the base) and after, over seeds.
* :func:`effect`: treatment - control, paired by seed (``after_T,s - after_C,s``; the base cancels), its mean and
  t-interval over seeds; :attr:`Estimate.excludes_zero` says whether the interval leaves 0 out. With 3 seeds the
  t-quantile is 4.30: only a large, consistent difference is called significant.
* :func:`shaping`: tool calls of the episodes that solved a (task, harness) both before and after, per arm, pooled
  over seeds (:func:`trainer.comparison.compare`'s shaping figures).
* :func:`page` / :func:`reward_figure`: the results page and its chart (mean training reward per iteration, both
  arms, with 95% bands).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from matplotlib.figure import Figure

from tasks.episodes import EpisodeRecord
from tasks.figures import Interval, Series, line_figure, mean_interval
from trainer.comparison import ALL, compare

Arm = Literal["treatment", "control"]
ARMS: tuple[Arm, ...] = ("treatment", "control")
Metric = Literal["pass_at_1", "reward"]


@dataclass(frozen=True)
class ArmRun:
    """One seed's run of one arm: its training episodes per iteration, and its held-out episodes after."""

    seed: int
    arm: Arm
    iterations: tuple[tuple[EpisodeRecord, ...], ...]
    heldout_after: tuple[EpisodeRecord, ...]


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds (None without any) and its 95% t-interval (None below two seeds)."""

    mean: float | None
    ci: Interval | None
    n: int

    @property
    def excludes_zero(self) -> bool | None:
        return None if self.ci is None else self.ci[0] > 0 or self.ci[1] < 0


def estimate(values: Sequence[float]) -> Estimate:
    return Estimate(statistics.fmean(values) if values else None, mean_interval(values), len(values))


def value(episodes: Sequence[EpisodeRecord], metric: Metric) -> float | None:
    """pass@1 (share of verifier passes) or mean reward of ``episodes``; None without any."""
    if not episodes:
        return None
    if metric == "pass_at_1":
        return statistics.fmean(float(e.verifier_passed) for e in episodes)
    return statistics.fmean(float(e.reward) for e in episodes)


def _runs(runs: Sequence[ArmRun], arm: Arm) -> list[ArmRun]:
    return sorted((r for r in runs if r.arm == arm), key=lambda r: r.seed)


def curve(runs: Sequence[ArmRun], arm: Arm, metric: Metric = "reward") -> list[Estimate]:
    """Per iteration (1-based order), the arm's mean over seeds of each seed's training ``metric``."""
    mine = _runs(runs, arm)
    depth = max((len(r.iterations) for r in mine), default=0)
    out = []
    for i in range(depth):
        per_seed = [value(r.iterations[i], metric) for r in mine if i < len(r.iterations)]
        out.append(estimate([v for v in per_seed if v is not None]))
    return out


def heldout(
    runs: Sequence[ArmRun], before: dict[int, Sequence[EpisodeRecord]], arm: Arm, metric: Metric
) -> tuple[Estimate, Estimate]:
    """(before, after) of ``metric`` on the held-out tasks, over the arm's seeds; ``before`` maps seed -> the base
    model's held-out episodes of that seed."""
    mine = _runs(runs, arm)
    b = [value(before.get(r.seed, ()), metric) for r in mine]
    a = [value(r.heldout_after, metric) for r in mine]
    return estimate([v for v in b if v is not None]), estimate([v for v in a if v is not None])


def effect(runs: Sequence[ArmRun], metric: Metric, where: Literal["heldout", "last_iteration"]) -> Estimate:
    """treatment - control, paired by seed, on the held-out episodes or the last training iteration's."""
    treated = {r.seed: r for r in _runs(runs, "treatment")}
    diffs = []
    for c in _runs(runs, "control"):
        t = treated.get(c.seed)
        if t is None:
            continue
        if where == "heldout":
            pair = value(t.heldout_after, metric), value(c.heldout_after, metric)
        else:
            pair = (
                value(t.iterations[-1], metric) if t.iterations else None,
                value(c.iterations[-1], metric) if c.iterations else None,
            )
        if pair[0] is not None and pair[1] is not None:
            diffs.append(pair[0] - pair[1])
    return estimate(diffs)


@dataclass(frozen=True)
class Shaping:
    solved_both: int
    tool_calls_before: float | None
    tool_calls_after: float | None


def shaping(runs: Sequence[ArmRun], before: dict[int, Sequence[EpisodeRecord]], arm: Arm) -> Shaping:
    """Tool calls on the (task, harness) pairs an arm solved both before and after, pooled over its seeds."""
    mine = _runs(runs, arm)
    b = [e for r in mine for e in before.get(r.seed, ())]
    a = [e for r in mine for e in r.heldout_after]
    row = next((c for c in compare(b, a) if c.harness == ALL), None)
    if row is None:
        return Shaping(0, None, None)
    return Shaping(row.solved_both, row.shaped_tool_calls_before, row.shaped_tool_calls_after)


# ------------------------------------------------------------------------------------------------ page, figure


def fmt(e: Estimate, pct: bool = False) -> str:
    if e.mean is None:
        return "n/a"
    scale, unit = (100.0, "%") if pct else (1.0, "")
    text = f"{e.mean * scale:.1f}{unit}" if pct else f"{e.mean:.3f}"
    if e.ci is not None:
        text += f" [{e.ci[0] * scale:.{1 if pct else 3}f}, {e.ci[1] * scale:.{1 if pct else 3}f}]"
    return text + f" (n={e.n})"


def verdict(e: Estimate) -> str:
    if e.excludes_zero is None:
        return "not testable (fewer than two seeds)"
    if e.mean is None:
        return "no data"
    if e.excludes_zero:
        return "significant at 95% (" + ("treatment higher" if e.mean > 0 else "treatment lower") + ")"
    return "not significant at 95% (the interval includes 0)"


def page(runs: Sequence[ArmRun], before: dict[int, Sequence[EpisodeRecord]], header: str) -> str:
    """The results page: ``header`` (machine, command, settings) then the tables."""
    lines = [header.rstrip(), "", "## Training reward per iteration (mean over seeds, 95% t-interval)", ""]
    curves = {arm: curve(runs, arm) for arm in ARMS}
    lines += ["| iteration | treatment | control |", "|---|---|---|"]
    for i in range(max(len(c) for c in curves.values())):
        cells = [fmt(curves[arm][i]) if i < len(curves[arm]) else "n/a" for arm in ARMS]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    lines += ["", "## Held-out tasks (never trained on): before (base) and after", ""]
    lines += [
        "| arm | pass@1 before | pass@1 after | mean reward before | mean reward after |",
        "|---|---|---|---|---|",
    ]
    for arm in ARMS:
        (pb, pa), (rb, ra) = heldout(runs, before, arm, "pass_at_1"), heldout(runs, before, arm, "reward")
        lines.append(f"| {arm} | {fmt(pb, True)} | {fmt(pa, True)} | {fmt(rb)} | {fmt(ra)} |")
    lines += ["", "## Treatment - control (paired by seed)", "", "| measure | difference | verdict |", "|---|---|---|"]
    for label, metric, where in (
        ("held-out pass@1", "pass_at_1", "heldout"),
        ("held-out mean reward", "reward", "heldout"),
        ("last iteration's training reward", "reward", "last_iteration"),
    ):
        e = effect(runs, metric, where)  # type: ignore[arg-type]
        lines.append(f"| {label} | {fmt(e, metric == 'pass_at_1')} | {verdict(e)} |")
    lines += ["", "## Tool calls on tasks solved both before and after (held-out, pooled over seeds)", ""]
    lines += ["| arm | (task, harness) pairs | tool calls before | tool calls after |", "|---|---|---|---|"]
    for arm in ARMS:
        s = shaping(runs, before, arm)
        b = "n/a" if s.tool_calls_before is None else f"{s.tool_calls_before:.2f}"
        a = "n/a" if s.tool_calls_after is None else f"{s.tool_calls_after:.2f}"
        lines.append(f"| {arm} | {s.solved_both} | {b} | {a} |")
    return "\n".join(lines) + "\n"


def reward_figure(runs: Sequence[ArmRun], title: str) -> Figure:
    """Mean training reward per iteration of both arms, with their 95% bands."""
    series = []
    for arm in ARMS:
        points = curve(runs, arm)
        series.append(
            Series(
                arm,
                tuple((i + 1.0, e.mean) for i, e in enumerate(points) if e.mean is not None),
                tuple((i + 1.0, e.ci[0], e.ci[1]) for i, e in enumerate(points) if e.ci is not None),
                "95% interval over seeds",
            )
        )
    return line_figure(title, series, xlabel="iteration", ylabel="mean reward", ylim=(0.0, 1.0))


__all__ = ["ARMS", "ArmRun", "Estimate", "curve", "effect", "estimate", "heldout", "page", "reward_figure", "shaping"]
