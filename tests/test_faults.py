"""benchmarks/faults.py, short form: each fault under a little load (a few sessions, a few seconds, two mitmdump
processes): every call a client saw complete is in a shard exactly once, no shard unreadable, the calls the fault hit
got vendor-shaped errors (or, for a killed proxy or a hung engine, no answer at all), other calls were unaffected.
The long form (more sessions, longer) is ``make bench``."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.faults import SCENARIOS, run_scenario, vendor_shaped


def test_vendor_shaped_knows_each_format() -> None:
    assert vendor_shaped("chat", '{"error": {"message": "x", "type": "server_error"}}')
    assert vendor_shaped("anthropic", '{"type": "error", "error": {"type": "overloaded_error", "message": "x"}}')
    assert not vendor_shaped("anthropic", '{"error": {"message": "internal proxy error"}}')
    assert vendor_shaped("responses", '{"type": "response.failed", "response": {}}')
    assert vendor_shaped("gemini", '{"error": {"code": 503, "message": "x", "status": "UNAVAILABLE"}}')
    assert not vendor_shaped("chat", "peer closed connection")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_fault_under_load(scenario: str, smollm2_tokenizer_dir: Path, tmp_path: Path) -> None:
    # two proxies where the fault hits one of them (the other one's sessions must not notice), else one
    n = 2 if scenario in ("proxy_kill9", "disk_full") else 1
    r = run_scenario(
        scenario, smollm2_tokenizer_dir, tmp_path, sessions=4, seconds=6.0, at_s=1.5, token_rate=200, proxies=n
    )
    assert r.verdict.ok, r
    assert r.not_vendor_shaped == 0 and r.outside_window == 0, r
    assert r.complete > 0, r
    if scenario in ("engine_errors", "engine_drop", "disk_full", "engine_kill9"):
        assert r.vendor_shaped > 0 and r.no_answer == 0, r  # the fault was hit, and answered in the vendor's shape
    if scenario == "latency_spike":
        assert r.failed == 0, r  # slow is not broken
    assert r.ok
