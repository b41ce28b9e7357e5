"""addon/generation/stats.py: percentiles, windows and the splice/fork accounting the admin route reports."""

from __future__ import annotations

from addon.generation.stats import Stats


def test_overhead_percentiles_and_calls_per_second() -> None:
    now = [100.0]
    stats = Stats(window=100, clock=lambda: now[0])
    for i in range(10):
        stats.overhead_in(i / 1000)
        stats.call_done(0.001, completion_tokens=5)
    snap = stats.snapshot()
    assert snap["calls"] == 10 and snap["completion_tokens"] == 50
    assert snap["overhead_ms"]["p50"] == 6.0  # before (5 ms) + after (1 ms) at the median
    assert snap["calls_per_s_last_60s"] == round(10 / 60, 3)
    now[0] += 61
    assert stats.snapshot()["calls_per_s_last_60s"] == 0.0
    assert snap["ready"] is False  # set by the runtime once the engine is bound and the tokenizer loaded


def test_window_bounds_memory_and_splices_give_the_fork_ratio() -> None:
    stats = Stats(window=3)
    for _ in range(10):
        stats.overhead_in(0.001)
    assert len(stats._overhead_in) == 3
    for reason in ["first_call", "extends", "extends", "history_rewritten"]:
        stats.splice(reason)
    snap = stats.snapshot()
    assert snap["splice"] == {"first_call": 1, "extends": 2, "history_rewritten": 1}
    assert snap["fork_ratio"] == 0.25  # one rewritten history in four calls; a first call is no fork
    stats.error("engine")
    assert stats.snapshot()["errors"] == {"engine": 1}
