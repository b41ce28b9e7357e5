"""benchmarks/addon_chain.py: one short round prints mitmdump's whole default chain and the lean one (its idle
addons dropped), each with a positive dispatch cost per flow."""

from __future__ import annotations

from benchmarks import addon_chain


def test_one_round_prints_both_chains(capsys) -> None:
    assert addon_chain.main(["--flows", "20", "--rounds", "1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| 1 |")]
    assert len(rows) == 1
    _, n_whole, whole, n_lean, lean, ratio = (c.strip() for c in rows[0])
    assert 10 <= int(n_lean) < int(n_whole)  # mitmdump's default chain (35 addons in mitmproxy 12), then the lean one
    assert float(whole) > 0 and float(lean) > 0 and float(ratio) > 0
