"""benchmarks/learning_analysis.py on synthetic episodes: per-seed means, t-intervals over seeds, the paired
treatment - control difference and its verdict, the shaping figures, the page and the chart."""

from __future__ import annotations

import math
import statistics
from datetime import UTC, datetime

from PIL import Image

from benchmarks import learning_analysis as la
from tasks.episodes import CallStats, EpisodeRecord
from tasks.figures import png

T0 = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)
T975_2 = 4.302653  # Student's t 97.5% quantile, 2 degrees of freedom (3 seeds)


def ep(task: str, passed: bool, reward: float, tools: int = 3, harness: str = "mini-swe-agent") -> EpisodeRecord:
    return EpisodeRecord(
        run_id="r", session_id=f"{task}-{passed}-{reward}-{tools}", task_id=task, task_version="1", harness=harness,
        harness_version="1", group_id=f"{task}/{harness}", task_group_id=task, sample_index=0, started_at=T0,
        reward=reward, reward_components={}, verifier_passed=passed, verifier_reward=float(passed),
        verifier_status="ok", verifier_output_tail="", exit_status=0, timed_out=False, crashed=False, wall_s=1.0,
        harness_s=1.0, stderr_tail="", stats=CallStats(calls=tools + 1, tool_call_count=tools),
    )  # fmt: skip


def eps(rewards: list[float], task: str = "a", tools: int = 3) -> tuple[EpisodeRecord, ...]:
    return tuple(ep(task, r >= 1.0, r, tools) for r in rewards)


# seed -> arm -> (training rewards per iteration, held-out after); the base's held-out before per seed
RUNS = [
    la.ArmRun(1, "treatment", (eps([0, 0.5]), eps([0.5, 1.0])), eps([1.0, 1.0, 0.0], "h", tools=2)),
    la.ArmRun(1, "control", (eps([0, 0.5]), eps([0, 0.5])), eps([1.0, 0.0, 0.0], "h", tools=4)),
    la.ArmRun(2, "treatment", (eps([0, 0]), eps([0.5, 0.5])), eps([1.0, 0.0, 1.0], "h", tools=2)),
    la.ArmRun(2, "control", (eps([0, 0]), eps([0, 0])), eps([1.0, 0.0, 0.0], "h", tools=4)),
    la.ArmRun(3, "treatment", (eps([0.5, 0]), eps([1.0, 0.5])), eps([1.0, 1.0, 0.0], "h", tools=3)),
    la.ArmRun(3, "control", (eps([0.5, 0]), eps([0.5, 0])), eps([0.0, 0.0, 1.0], "h", tools=5)),
]
BEFORE = {s: eps([1.0, 0.0, 0.0], "h", tools=6) for s in (1, 2, 3)}


def t_interval(values: list[float]) -> tuple[float, float]:
    m, half = statistics.fmean(values), T975_2 * statistics.stdev(values) / math.sqrt(len(values))
    return m - half, m + half


def test_the_curve_is_the_mean_over_seeds_of_each_seeds_mean_reward() -> None:
    treated = la.curve(RUNS, "treatment")
    assert [e.n for e in treated] == [3, 3]
    per_seed = [0.75, 0.5, 0.75]  # iteration 2: each seed's mean reward
    assert math.isclose(treated[1].mean or 0, statistics.fmean(per_seed))
    assert treated[1].ci == pytest_approx(t_interval(per_seed))
    control = la.curve(RUNS, "control")
    assert math.isclose(control[0].mean or 0, treated[0].mean or 0)  # iteration 1 is the same collect in both arms


def test_heldout_before_is_the_base_and_after_is_the_arms_checkpoint() -> None:
    before, after = la.heldout(RUNS, BEFORE, "treatment", "pass_at_1")
    assert math.isclose(before.mean or 0, 1 / 3) and before.ci == pytest_approx((1 / 3, 1 / 3))
    assert math.isclose(after.mean or 0, 2 / 3) and after.ci == pytest_approx((2 / 3, 2 / 3))


def test_the_effect_is_paired_by_seed_and_its_verdict_follows_its_interval() -> None:
    e = la.effect(RUNS, "pass_at_1", "heldout")  # 2/3 - 1/3 in every seed
    assert math.isclose(e.mean or 0, 1 / 3) and e.ci == pytest_approx((1 / 3, 1 / 3))
    assert e.excludes_zero is True and la.verdict(e).startswith("significant")
    rewards = la.effect(RUNS, "reward", "heldout")
    assert math.isclose(rewards.mean or 0, 1 / 3)
    last = la.effect(RUNS, "reward", "last_iteration")
    assert last.mean is not None and math.isclose(last.mean, statistics.fmean([0.5, 0.5, 0.5]))
    assert last.ci == pytest_approx((0.5, 0.5))  # no spread over seeds: a zero-width interval
    noisy = la.estimate([0.2, -0.1, 0.3])
    assert noisy.excludes_zero is False and "not significant" in la.verdict(noisy)
    one = la.estimate([0.4])
    assert one.ci is None and one.excludes_zero is None and "not testable" in la.verdict(one)


def test_shaping_counts_tool_calls_of_pairs_solved_before_and_after() -> None:
    treated = la.shaping(RUNS, BEFORE, "treatment")
    assert treated.solved_both == 1  # one (task, harness) pair: h / mini-swe-agent
    assert treated.tool_calls_before == 6 and math.isclose(treated.tool_calls_after or 0, (2 * 2 + 2 * 2 + 2 * 3) / 6)
    assert la.shaping([], BEFORE, "control") == la.Shaping(0, None, None)


def test_the_page_has_every_table_and_the_chart_draws(tmp_path) -> None:
    text = la.page(RUNS, BEFORE, "# learning\n\nsettings")
    for heading in ("Training reward per iteration", "Held-out tasks", "Treatment - control", "Tool calls on tasks"):
        assert heading in text
    assert "| 2 | 0.667 [" in text and "significant at 95% (treatment higher)" in text
    out = tmp_path / "c.png"
    out.write_bytes(png(la.reward_figure(RUNS, "mean training reward")))
    assert Image.open(out).size[0] > 400


def pytest_approx(pair: tuple[float, float]):
    import pytest

    return pytest.approx(pair, abs=1e-4)  # tasks.figures' t table has 4 decimals
