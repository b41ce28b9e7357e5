"""benchmarks/engine_client.py: one real round against the fake engine prints a row per client with positive
wall and CPU figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import engine_client


@pytest.mark.integration
def test_one_round_prints_a_row_per_client(smollm2_tokenizer_dir: Path, capsys) -> None:
    argv = ["--model-dir", str(smollm2_tokenizer_dir), "--prompts", "500", "--calls", "5", "--rounds", "1"]
    assert engine_client.main(argv) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| 500 |")]
    assert [r[2].strip() for r in rows] == [
        "httpx stream",
        "aiohttp stream",
        "EngineClient.stream",
        "EngineClient.stream, prompt JSON ready",
    ]
    assert all(float(r[3]) > 0 and float(r[4]) >= 0 for r in rows)
