"""benchmarks/side_by_side.py: the page's two figures, read back from their artists (the benchmark itself runs
under ``make bench``)."""

from __future__ import annotations

from benchmarks.context_sweep import ContextRow
from benchmarks.side_by_side import LevelRow, page_figures


def level(target: str, sessions: int, calls_per_s: float) -> LevelRow:
    return LevelRow(target, sessions, 100, 0, calls_per_s, 10.0, 20.0, 0.002, 0.5, 1.0, None)


def test_page_figures_fraction_of_direct_and_added_latency() -> None:
    levels = [
        level("direct", 32, 200.0), level("harnessrl x1", 32, 190.0), level("harnessrl x2", 32, 150.0),
        level("direct", 96, 400.0), level("harnessrl x1", 96, 300.0),  # x2 did not run at 96
    ]  # fmt: skip
    contexts = [ContextRow(8000, 7900, 2.0, 5.0, 30.0, 10.0, 6), ContextRow(32000, 31000, -0.5, 9.0, 90.0, 30.0, 6)]
    figs = page_figures({"levels": levels, "contexts": contexts, "tokens": 64, "token_rate": 100.0})
    ax = figs["fraction_of_direct"].axes[0]
    assert [b.get_height() for b in ax.patches] == [95.0, 75.0, 75.0, 0.0]  # x1 at 32, 96; x2 at 32, 96
    assert [t.get_text() for t in ax.texts] == ["95", "75", "75", "n/a"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["32", "96"]
    assert [t.get_text() for t in figs["fraction_of_direct"].legends[0].get_texts()] == ["harnessrl x1", "harnessrl x2"]
    assert ax.get_ylabel() == "% of direct calls/s" and ax.get_xlabel() == "concurrent sessions"
    assert "64 tokens per answer at 100 tokens/s" in ax.get_title(loc="left")
    ax = figs["added_latency"].axes[0]
    assert [b.get_height() for b in ax.patches] == [2.0, -0.5, 5.0, 9.0]  # p50 by context, then p99
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8k", "32k"]
    assert ax.get_ylabel() == "added latency per call (ms)" and ax.get_ylim()[0] < -0.5
    assert [t.get_text() for t in figs["added_latency"].legends[0].get_texts()] == ["mitmproxy p50", "mitmproxy p99"]
    with_url = page_figures({"levels": levels, "contexts": contexts, "contexts_base_url": contexts})
    assert len(with_url["added_latency"].axes[0].patches) == 8  # and the base URL's p50 and p99
