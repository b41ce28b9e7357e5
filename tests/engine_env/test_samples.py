"""trainer/samples.py: crafted multi-call episodes -> samples (mask, captured logprobs, advantages, drops)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from addon.records.schema import CallRecord, TurnTokens
from tasks.episodes import CallStats, EpisodeRecord
from trainer.samples import SampleOptions, advantages, build_samples, collect_metrics

T0 = datetime(2026, 12, 2, 12, tzinfo=UTC)


def call(
    session: str,
    i: int,
    prompt: list[int],
    completion: list[int],
    logprobs: list[float],
    *,
    parent: int | None = None,
    version: int | None = 0,
    **kw: Any,
) -> CallRecord:
    return CallRecord(
        run_id="run",
        session_id=session,
        call_index=i,
        call_id=f"{session}/{i}",
        harness=kw.pop("harness", "pi"),
        wire_format="chat",
        route="/v1/chat/completions",
        model="m",
        received_at=T0 + timedelta(seconds=i),
        done_at=T0 + timedelta(seconds=i, milliseconds=500),
        tokens=TurnTokens(tuple(prompt), tuple(completion), tuple(logprobs)),
        request_canonical=b"",
        policy_version=version,
        parent_call_id=None if parent is None else f"{session}/{parent}",
        **kw,
    )


def multi_call_session(session: str, version: int | None = 0, temperature: float = 1.0) -> list[CallRecord]:
    """Three agent calls (the second and third extend the first: tool results and template glue between the
    sampled spans) and one auxiliary title call."""
    s = {"temperature": temperature}
    c0 = call(session, 0, [1, 2, 3, 4, 5], [6, 7], [-0.5, -0.25], version=version, sampling_applied=s)
    c1 = call(session, 1, [1, 2, 3, 4, 5, 6, 7, 8, 9], [10, 11], [-1.5, -0.125], parent=0, version=version,
              sampling_applied=s)  # fmt: skip
    aux = call(session, 2, [50, 51], [52], [-2.0], version=version, auxiliary=True, auxiliary_reason="title")
    c3 = call(session, 3, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], [13, 14, 15], [-0.75, -3.0, -0.0625], parent=1,
              version=version, sampling_applied=s)  # fmt: skip
    return [c0, c1, aux, c3]


def episode(session: str, task: str, harness: str, reward: float, **kw: Any) -> EpisodeRecord:
    return EpisodeRecord(
        run_id="run",
        session_id=session,
        task_id=task,
        task_version="1",
        harness=harness,
        harness_version="0",
        group_id=f"{task}/{harness}",
        task_group_id=task,
        sample_index=0,
        started_at=T0,
        reward=reward,
        reward_components={"pass": reward},
        verifier_passed=reward >= 1.0,
        verifier_reward=reward,
        verifier_status="ok",
        verifier_output_tail="",
        exit_status=0,
        timed_out=False,
        crashed=False,
        wall_s=1.0,
        harness_s=1.0,
        stderr_tail="",
        stats=kw.pop("stats", CallStats(tool_call_count=2)),
        **kw,
    )


def test_loss_mask_is_exactly_the_sampled_tokens_and_logprobs_are_the_captured_ones() -> None:
    records = multi_call_session("a") + multi_call_session("b")
    eps = [episode("a", "t", "pi", 1.0), episode("b", "t", "pi", 0.0)]
    out = build_samples(eps, records, SampleOptions(current_version=0))
    assert out.stats.samples == 2 and out.stats.dropped_auxiliary == 2
    s = next(x for x in out.samples if x.session_id == "a")
    assert s.input_ids == tuple(range(1, 16))
    sampled = {6, 7, 10, 11, 13, 14, 15}
    # every prompt, tool-result and template token (1-5, 8, 9, 12) is off the mask; every sampled one is on it
    assert [tok for tok, m in zip(s.input_ids, s.loss_mask, strict=True) if m] == sorted(sampled)
    captured = {6: -0.5, 7: -0.25, 10: -1.5, 11: -0.125, 13: -0.75, 14: -3.0, 15: -0.0625}
    for tok, m, lp in zip(s.input_ids, s.loss_mask, s.behaviour_logprobs, strict=True):
        assert lp == (captured[tok] if m else 0.0)
    assert s.trained_tokens == 7


def test_auxiliary_calls_are_samples_only_when_asked() -> None:
    records = multi_call_session("a") + multi_call_session("b")
    eps = [episode("a", "t", "pi", 1.0), episode("b", "t", "pi", 0.0)]
    out = build_samples(eps, records, SampleOptions(include_auxiliary=True))
    aux = [s for s in out.samples if s.input_ids == (50, 51, 52)]
    assert len(aux) == 2 and aux[0].loss_mask == (0, 0, 1) and aux[0].behaviour_logprobs[-1] == -2.0


def test_zero_variance_groups_give_no_samples_and_are_counted() -> None:
    sessions = ["a", "b", "c", "d"]
    records = [r for s in sessions for r in multi_call_session(s)]
    eps = [
        episode("a", "same", "pi", 1.0),
        episode("b", "same", "pi", 1.0),
        episode("c", "varied", "pi", 1.0),
        episode("d", "varied", "pi", 0.0),
    ]
    out = build_samples(eps, records, SampleOptions())
    assert {s.session_id for s in out.samples} == {"c", "d"}
    assert out.stats.zero_variance_groups == 1 and out.stats.groups == 2
    assert out.stats.dropped_zero_variance == 2
    assert "a" not in out.advantages and "b" not in out.advantages


def test_group_normalised_advantages_follow_scale_rewards() -> None:
    eps = [episode("a", "t", "pi", 1.0), episode("b", "t", "pi", 0.0), episode("c", "t", "pi", 0.0)]
    grouped, n, zero = advantages(eps, "task", "group")
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # sample std, as torch.std in TRL
    assert n == 1 and zero == 0
    assert grouped["a"] == pytest.approx((2 / 3) / (std + 1e-4))
    assert grouped["b"] == pytest.approx((-1 / 3) / (std + 1e-4))
    unscaled, _, _ = advantages(eps, "task", "none")
    assert unscaled == pytest.approx({"a": 2 / 3, "b": -1 / 3, "c": -1 / 3})


def test_grouping_across_harnesses_or_per_harness() -> None:
    eps = [
        episode("a", "t", "pi", 1.0),
        episode("b", "t", "pi", 1.0),
        episode("c", "t", "mini-swe-agent", 0.0),
        episode("d", "t", "mini-swe-agent", 0.0),
    ]
    across, n_across, zero_across = advantages(eps, "task", "none")
    assert n_across == 1 and zero_across == 0 and across["a"] == 0.5 and across["c"] == -0.5
    per, n_per, zero_per = advantages(eps, "task_harness", "none")
    assert n_per == 2 and zero_per == 2 and per == {}


def test_harness_weights_multiply_the_sample_weight() -> None:
    records = [
        r
        for s, h in [("a", "pi"), ("b", "pi"), ("c", "mini-swe-agent"), ("d", "mini-swe-agent")]
        for r in multi_call_session(s)
    ]
    eps = [
        episode("a", "t", "pi", 1.0),
        episode("b", "t", "pi", 0.0),
        episode("c", "t", "mini-swe-agent", 1.0),
        episode("d", "t", "mini-swe-agent", 0.0),
    ]
    out = build_samples(eps, records, SampleOptions(harness_weights={"pi": 2.5}))
    assert {s.harness: s.weight for s in out.samples} == {"pi": 2.5, "mini-swe-agent": 1.0}


@pytest.mark.parametrize(
    ("policy", "max_staleness", "kept_versions"),
    [("refuse", 5, {3}), ("is_correct", 1, {2, 3}), ("is_correct", 0, {3})],
)
def test_staleness_policy(policy: str, max_staleness: int, kept_versions: set[int]) -> None:
    versions = {"a": 3, "b": 2, "c": 1, "d": 3}
    records = [r for s, v in versions.items() for r in multi_call_session(s, version=v)]
    eps = [episode(s, "t", "pi", float(i % 2)) for i, s in enumerate(versions)]
    opts = SampleOptions(staleness=policy, max_staleness=max_staleness, current_version=3)  # type: ignore[arg-type]
    out = build_samples(eps, records, opts)
    assert {s.policy_version for s in out.samples} == kept_versions
    assert out.stats.dropped_stale == 4 - len(out.samples)


def test_unversioned_records_are_refused_only_by_refuse() -> None:
    records = multi_call_session("a", version=None) + multi_call_session("b", version=None)
    eps = [episode("a", "t", "pi", 1.0), episode("b", "t", "pi", 0.0)]
    refused = build_samples(eps, records, SampleOptions(staleness="refuse", current_version=0))
    assert refused.stats.samples == 0 and refused.stats.dropped_stale == 2
    kept = build_samples(eps, records, SampleOptions(staleness="is_correct", current_version=0))
    assert kept.stats.samples == 2


def test_sequences_longer_than_max_length_are_dropped_not_cut() -> None:
    records = multi_call_session("a") + multi_call_session("b")
    eps = [episode("a", "t", "pi", 1.0), episode("b", "t", "pi", 0.0)]
    out = build_samples(eps, records, SampleOptions(max_length=14))
    assert out.stats.samples == 0 and out.stats.dropped_too_long == 2


def test_temperatures_follow_the_applied_sampling() -> None:
    records = multi_call_session("a", temperature=0.7) + multi_call_session("b", temperature=0.7)
    eps = [episode("a", "t", "pi", 1.0), episode("b", "t", "pi", 0.0)]
    s = build_samples(eps, records, SampleOptions()).samples[0]
    assert [t for t, m in zip(s.temperatures, s.loss_mask, strict=True) if m] == [0.7] * 7
    assert {t for t, m in zip(s.temperatures, s.loss_mask, strict=True) if not m} == {1.0}


def test_episodes_the_collector_failed_on_are_left_out() -> None:
    records = multi_call_session("a") + multi_call_session("b")
    eps = [episode("a", "t", "pi", 1.0), episode("b", "t", "pi", 0.0), episode("x", "t", "pi", 0.0, error="boom")]
    out = build_samples(eps, records, SampleOptions())
    assert out.stats.errored_episodes == 1 and out.stats.episodes == 3
    assert out.advantages["a"] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4))  # x would change it


def test_collect_metrics() -> None:
    eps = [
        episode("a", "t", "pi", 1.0),
        episode("b", "t", "pi", 0.0, stats=CallStats(tool_call_count=4)),
        episode("c", "t", "mini-swe-agent", 0.5),
    ]
    m = collect_metrics(eps, zero_variance_groups=1)
    assert m["episodes"] == 3 and m["reward_mean"] == pytest.approx(0.5)
    assert m["reward_std"] == pytest.approx(math.sqrt(1 / 6))
    assert m["pass_at_1"] == pytest.approx(1 / 3) and m["pass_at_1/pi"] == 0.5 and m["pass_at_1/mini-swe-agent"] == 0
    assert m["tool_calls_mean/pi"] == 3.0 and m["zero_variance_groups"] == 1
