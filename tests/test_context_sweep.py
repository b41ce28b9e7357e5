"""benchmarks/context_sweep.py: the interleaved sweep against a real proxy (mitmproxy and its base URL) and the fake
engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from addon import launch
from addon.records.schema import read_records
from benchmarks import fake_engine, tree
from benchmarks.context_sweep import context_sweeps
from benchmarks.replayer import BaseUrl, Proxied


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
