"""benchmarks/side_by_side.py: the page's two figures, read back from their artists, and the interleaved context
sweep against a real proxy (the benchmark itself runs under ``make bench``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from addon import launch
from addon.records.schema import read_records
from benchmarks import fake_engine, tree
from benchmarks.replayer import BaseUrl, Proxied
from benchmarks.side_by_side import ContextRow, LevelRow, context_sweeps, page_figures


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


@pytest.mark.integration
def test_the_context_sweep_interleaves_direct_and_every_target_session_by_session(
    smollm2_tokenizer_dir: Path, tmp_path: Path
) -> None:
    """A real proxy (mitmproxy and its base URL) and the fake engine: each target gets a row per size over as many
    calls as the scripts hold (the warm-up not counted), its sessions under their own ids, and a session runs
    through both targets before the next session starts."""
    engine = fake_engine.spawn(str(smollm2_tokenizer_dir), launch.free_port(), token_rate=0, tokens=8)
    (proxy,) = tree.start_proxies(engine.url, 1, tmp_path / "p", smollm2_tokenizer_dir)
    try:
        targets = {"mitmproxy": Proxied((proxy,)), "base URL": BaseUrl((proxy,))}
        rows = context_sweeps(engine.url, targets, [300], 3, 5, ("chat", "anthropic"), sessions=1)
    finally:
        proxy.stop()
        engine.stop()
    for name in targets:
        (row,) = rows[name]
        assert (row.target_tokens, row.calls) == (300, 6)  # 2 sessions x 3 calls
        assert row.prompt_tokens_p50 > 200 and row.first_p50_ms > 0 and row.direct_p50_ms > 0
    table = read_records(str(proxy.records), columns=["session_id", "call_index", "received_at"])
    order = sorted(
        zip(table["received_at"].to_pylist(), table["session_id"].to_pylist(), strict=True), key=lambda r: r[0]
    )
    sessions = list(dict.fromkeys(s for _, s in order))
    assert [s for s in sessions if s.startswith("warm")] == [
        "warm-t0-chat", "warm-t1-chat", "warm-t0-anthropic", "warm-t1-anthropic"
    ]  # fmt: skip
    measured = [s for s in sessions if not s.startswith("warm")]
    assert len(measured) == 4 and [s[-3:] for s in measured] == ["-t0", "-t1", "-t1", "-t0"]  # rotating
    assert measured[0][:-3] == measured[1][:-3] != measured[2][:-3] == measured[3][:-3]
    blocks = [s for i, (_, s) in enumerate(order) if i == 0 or order[i - 1][1] != s]
    assert blocks == sessions and len(order) == 4 * 2 + 4 * 3  # each session's calls together, none missing
