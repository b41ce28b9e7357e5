"""trainer/comparison.py: the cross-harness table's aggregation on synthetic episodes with known outcomes: pass@1
with its Wilson interval, mean reward and tool calls with their t intervals, the changes and their MOVER intervals,
the transfer columns (trained harness vs the others), and the table, JSON and figures that hold them. Every
expected number is computed here from the episodes, independently of tasks/figures.py."""

from __future__ import annotations

import json
import math
import statistics
from datetime import UTC, datetime
from pathlib import Path

import pytest
from PIL import Image

from tasks.episodes import ALL, CallStats, EpisodeRecord
from trainer import comparison as cmp

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
Z = 1.959963984540054
T975 = {3: 3.182446, 5: 2.570582, 7: 2.364624, 9: 2.262157}  # Student's t 97.5% quantiles by degrees of freedom


def ep(harness: str, i: int, passed: bool, reward: float, tools: int) -> EpisodeRecord:
    return EpisodeRecord(
        run_id="r", session_id=f"{harness}-{i}", task_id=f"t{i % 3}", task_version="1", harness=harness,
        harness_version="1", group_id=f"t{i % 3}/{harness}", task_group_id=f"t{i % 3}", sample_index=i // 3,
        started_at=T0, reward=reward, reward_components={}, verifier_passed=passed, verifier_reward=float(passed),
        verifier_status="ok", verifier_output_tail="", exit_status=0, timed_out=False, crashed=False, wall_s=1.0,
        harness_s=1.0, stderr_tail="", stats=CallStats(calls=tools + 1, tool_call_count=tools),
    )  # fmt: skip


# harness -> (passed, rewards, tool calls), before and after; opencode is the trained harness
DATA = {
    "opencode": (
        ("11000000", (1.06, 1.04, 0.2, 0, 0, 0.1, 0, 0), (4, 6, 10, 12, 8, 9, 15, 2)),
        ("11111100", (1.07, 1.06, 1.05, 1.05, 1.04, 1.08, 0, 0.3), (3, 4, 5, 6, 4, 2, 11, 9)),
    ),
    "pi": (
        ("101010", (1, 0, 1, 0, 1, 0.5), (5, 7, 5, 9, 6, 3)),
        ("110010", (1, 1, 0, 0, 1, 0), (4, 6, 8, 10, 5, 7)),
    ),
    "codex": (
        ("0010", (0, 0, 1, 0.2), (10, 11, 6, 12)),
        ("1010", (1, 0, 1, 0), (6, 13, 5, 9)),
    ),
}


def episodes(side: int, harnesses: tuple[str, ...] = tuple(DATA)) -> list[EpisodeRecord]:
    out = []
    for h in harnesses:
        passed, rewards, tools = DATA[h][side]
        out += [ep(h, i, p == "1", float(r), t) for i, (p, r, t) in enumerate(zip(passed, rewards, tools, strict=True))]
    return out


BEFORE, AFTER = episodes(0), episodes(1)


def wilson(k: int, n: int) -> tuple[float, float]:
    p = k / n
    centre = (k + Z**2 / 2) / (n + Z**2)
    half = Z * math.sqrt(n) / (n + Z**2) * math.sqrt(p * (1 - p) + Z**2 / (4 * n))
    return centre - half, centre + half


def t_interval(xs: list[float]) -> tuple[float, float]:
    half = T975[len(xs) - 1] * statistics.stdev(xs) / math.sqrt(len(xs))
    return statistics.fmean(xs) - half, statistics.fmean(xs) + half


def mover(b: float, b_ci: tuple[float, float], a: float, a_ci: tuple[float, float]) -> tuple[float, float, float]:
    d = a - b
    return (
        d,
        d - math.sqrt((a - a_ci[0]) ** 2 + (b_ci[1] - b) ** 2),
        d + math.sqrt((a_ci[1] - a) ** 2 + (b - b_ci[0]) ** 2),
    )


def expected(harnesses: tuple[str, ...], side: int) -> dict[str, tuple[float, tuple[float, float]]]:
    """pass@1, mean reward and mean tool calls of the pooled episodes of ``harnesses``, each with its interval."""
    passed = [c == "1" for h in harnesses for c in DATA[h][side][0]]
    rewards = [float(r) for h in harnesses for r in DATA[h][side][1]]
    tools = [float(t) for h in harnesses for t in DATA[h][side][2]]
    return {
        "pass_at_1": (sum(passed) / len(passed), wilson(sum(passed), len(passed))),
        "reward": (statistics.fmean(rewards), t_interval(rewards)),
        "tool_calls": (statistics.fmean(tools), t_interval(tools)),
    }


def assert_side(side: cmp.Side, want: dict[str, tuple[float, tuple[float, float]]]) -> None:
    for metric, (value, (low, high)) in want.items():
        assert getattr(side, metric) == pytest.approx(value, abs=1e-12)
        ci = getattr(side, f"{metric}_ci")
        assert ci is not None and ci == (pytest.approx(low, abs=2e-4), pytest.approx(high, abs=2e-4))


def assert_change(row: cmp.HarnessComparison, harnesses: tuple[str, ...]) -> None:
    before, after = expected(harnesses, 0), expected(harnesses, 1)
    for metric in cmp.METRICS:
        d, low, high = mover(*before[metric], *after[metric])
        change = row.change(metric)
        assert change is not None and change.value == pytest.approx(d, abs=1e-12)
        assert change.interval == (pytest.approx(low, abs=3e-4), pytest.approx(high, abs=3e-4))


def test_each_harness_has_pass_at_1_with_wilson_and_means_with_t_intervals() -> None:
    rows = {r.harness: r for r in cmp.compare(BEFORE, AFTER, trained=("opencode",))}
    assert list(rows) == ["opencode", "pi", "codex", ALL]
    assert [r.trained for r in rows.values()] == [True, False, False, False]
    assert rows["opencode"].before.pass_at_1 == 0.25 and rows["opencode"].after.pass_at_1 == 0.75
    assert rows["opencode"].before.pass_at_1_ci == pytest.approx((0.0715, 0.5907), abs=1e-4)  # Wilson 2/8 by hand
    for name in DATA:
        assert (rows[name].before.episodes, rows[name].after.episodes) == (len(DATA[name][0][0]),) * 2
        assert_side(rows[name].before, expected((name,), 0))
        assert_side(rows[name].after, expected((name,), 1))
        assert_change(rows[name], (name,))
    assert rows[ALL].before.episodes == 18
    assert rows[ALL].before.pass_at_1 == pytest.approx(6 / 18) and rows[ALL].after.pass_at_1 == pytest.approx(11 / 18)
    assert rows[ALL].before.pass_at_1_ci == pytest.approx(wilson(6, 18), abs=1e-12)


def test_difference_is_newcombes_interval_for_two_proportions() -> None:
    # Newcombe (1998), Statistics in Medicine 17:873, example (a): 56/70 - 48/80, method 10: +0.0524 to +0.3339
    a, b = cmp.wilson_interval(56, 70), cmp.wilson_interval(48, 80)
    change = cmp.difference(48 / 80, b, 56 / 70, a)
    assert change is not None and change.value == pytest.approx(0.2)
    assert change.interval == (pytest.approx(0.0524, abs=1e-4), pytest.approx(0.3339, abs=1e-4))
    assert cmp.difference(None, None, 0.5, (0.1, 0.9)) is None
    assert cmp.difference(0.5, None, 0.75, (0.4, 0.9)) == cmp.Change(0.25, None)  # one side without interval


def test_transfer_pools_the_trained_harness_against_the_others() -> None:
    moved = cmp.transfer(BEFORE, AFTER, ("opencode",))
    assert moved is not None and moved.other is not None
    assert moved.trained_harnesses == ("opencode",) and moved.other_harnesses == ("pi", "codex")
    assert (moved.trained.before.episodes, moved.other.before.episodes) == (8, 10)
    assert_side(moved.trained.after, expected(("opencode",), 1))
    assert_side(moved.other.before, expected(("pi", "codex"), 0))
    assert_side(moved.other.after, expected(("pi", "codex"), 1))
    assert moved.other.before.pass_at_1 == pytest.approx(0.4) and moved.other.after.pass_at_1 == pytest.approx(0.5)
    assert_change(moved.trained, ("opencode",))
    assert_change(moved.other, ("pi", "codex"))
    for metric in cmp.METRICS:  # trained - other: the MOVER interval of the difference of the two changes
        dt, lt, ht = mover(*expected(("opencode",), 0)[metric], *expected(("opencode",), 1)[metric])
        do, lo, ho = mover(*expected(("pi", "codex"), 0)[metric], *expected(("pi", "codex"), 1)[metric])
        gap_value, gap_low, gap_high = mover(do, (lo, ho), dt, (lt, ht))
        gap = moved.gap(metric)
        assert gap is not None and gap.value == pytest.approx(gap_value, abs=1e-12)
        assert gap.interval == (pytest.approx(gap_low, abs=5e-4), pytest.approx(gap_high, abs=5e-4))
    assert moved.gap("pass_at_1").value == pytest.approx(0.5 - 0.1)  # type: ignore[union-attr]
    assert cmp.transfer(BEFORE, AFTER, ()) is None
    everything = cmp.transfer(BEFORE, AFTER, tuple(DATA))
    assert everything is not None and everything.other is None and everything.gap("reward") is None


def cells(markdown: str, first: str, section: str = "Cross-harness table") -> list[str]:
    """The cells of the row whose first cell is ``first`` in the table under ``## section`` (exactly one row)."""
    part = next(p for p in markdown.split("## ") if p.startswith(section))
    found = [line for line in part.splitlines() if line.startswith(f"| {first} |")]
    assert len(found) == 1, found
    return [c.strip() for c in found[0].strip("|").split("|")]


def fmt(value: float, ci: tuple[float, float] | None, sign: str = "") -> str:
    return f"{value:{sign}.3f}" + ("" if ci is None else f" [{ci[0]:{sign}.3f}, {ci[1]:{sign}.3f}]")


def test_markdown_holds_the_cross_harness_and_transfer_tables() -> None:
    rows = cmp.compare(BEFORE, AFTER, ("opencode",))
    moved = cmp.transfer(BEFORE, AFTER, ("opencode",))
    text = cmp.comparison_markdown(rows, ("base", "ckpt"), "smoke", moved)
    assert "## Cross-harness table" in text and "## Transfer" in text and "## Shaping effect" in text
    by = {r.harness: r for r in rows}
    for name, trained in (("opencode", "yes"), ("pi", "no"), ("codex", "no")):
        r = by[name]
        row = cells(text, name)
        assert row[:4] == [name, trained, str(r.before.episodes), str(r.after.episodes)]
        assert row[4] == fmt(r.before.pass_at_1, r.before.pass_at_1_ci)  # type: ignore[arg-type]
        assert row[9] == fmt(r.change("reward").value, r.change("reward").interval, "+")  # type: ignore[union-attr]
        assert row[11] == fmt(r.after.tool_calls, r.after.tool_calls_ci)  # type: ignore[arg-type]
    assert cells(text, "opencode")[4] == "0.250 [0.071, 0.591]" and cells(text, "opencode")[6].startswith("+0.500 [")
    assert cells(text, ALL)[1] == "-"
    assert moved is not None and moved.other is not None
    other = cells(text, "other", "Transfer")
    assert other[:4] == ["other", "pi, codex", "10", "10"]
    assert other[4] == fmt(moved.other.change("pass_at_1").value, moved.other.change("pass_at_1").interval, "+")  # type: ignore[union-attr]
    gap = cells(text, "trained − other", "Transfer")
    assert cells(text, "opencode", "Shaping effect")[1:] == ["2", "5.000", "4.250", "-15%"]
    assert gap[4:] == [fmt(moved.gap(m).value, moved.gap(m).interval, "+") for m in cmp.METRICS]  # type: ignore[union-attr]
    unknown = cmp.comparison_markdown(cmp.compare(BEFORE, AFTER), ("base", "ckpt"))
    assert "## Transfer" not in unknown and cells(unknown, "pi")[1] == "-" and "--trained-harnesses" in unknown


def test_a_single_episode_has_a_value_but_no_t_interval() -> None:
    (row, _) = cmp.compare([ep("pi", 0, True, 1.0, 3)], [ep("pi", 0, False, 0.0, 5)])
    assert row.before.reward_ci is None and row.before.pass_at_1_ci == pytest.approx(wilson(1, 1), abs=1e-12)
    assert row.change("reward") == cmp.Change(-1.0, None)
    assert cells(cmp.comparison_markdown([row]), "pi")[7:10] == ["1.000", "0.000", "-1.000"]


def test_files_json_and_figures(tmp_path: Path) -> None:
    rows = cmp.write_comparison(tmp_path, BEFORE, AFTER, ("base", "ckpt"), "smoke", trained=("opencode",))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(cmp.COMPARISON_FILES)
    for name in cmp.COMPARISON_FILES[2:]:
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and image.size[0] > 400 and image.size[1] > 200
    data = json.loads((tmp_path / "comparison.json").read_text())
    assert data["rows"][0]["harness"] == "opencode" and data["rows"][0]["trained"] is True
    assert data["rows"][0]["change"]["pass_at_1"]["value"] == pytest.approx(0.5)
    assert data["rows"][0]["before"]["pass_at_1_ci"] == pytest.approx(list(wilson(2, 8)), abs=1e-12)
    assert data["transfer"]["other_harnesses"] == ["pi", "codex"]
    assert data["transfer"]["gap"]["pass_at_1"]["value"] == pytest.approx(0.4)
    assert "| opencode | yes |" in (tmp_path / "comparison.md").read_text()

    moved = cmp.transfer(BEFORE, AFTER, ("opencode",))
    figs = cmp.comparison_figures(rows, ("base", "ckpt"), "smoke", moved)
    ax = figs["change"].axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["opencode (trained)", "pi", "codex", "trained (pooled)", "other (pooled)"]
    groups = [*rows[:3], moved.trained, moved.other]  # type: ignore[union-attr]
    want = [g.change("pass_at_1").value for g in groups] + [g.change("reward").value for g in groups]  # type: ignore[union-attr]
    assert [b.get_height() for b in ax.patches] == pytest.approx(want)
    ends = sorted(tuple(seg[:, 1]) for c in ax.collections for seg in c.get_segments())
    intervals = [g.change(m).interval for m in ("pass_at_1", "reward") for g in groups]  # type: ignore[union-attr]
    assert [v for e in ends for v in e] == pytest.approx([v for iv in sorted(intervals) for v in iv])  # type: ignore[union-attr]
    assert ax.get_ylim()[0] <= min(low for low, _ in intervals)  # the lowest error bar is inside the axes
    ax = figs["reward"].axes[0]
    assert [b.get_height() for b in ax.patches][:3] == pytest.approx([r.before.reward for r in rows[:3]])  # type: ignore[misc]
