"""benchmarks/mitm_floor.py: one real round through a bare relaying mitmdump prints a row per context with a
positive added latency and every steady call counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import mitm_floor


@pytest.mark.integration
def test_one_round_prints_a_positive_floor_per_context(smollm2_tokenizer_dir: Path, capsys) -> None:
    argv = ["--model-dir", str(smollm2_tokenizer_dir), "--contexts", "1500", "--calls", "3", "--rounds", "1"]
    assert mitm_floor.main(argv) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| 1500 |")]
    assert len(rows) == 1
    _, _, added, _, direct, calls = (c.strip() for c in rows[0])
    assert float(added) > 0 and float(direct) > 0 and int(calls) == 4 * 2  # 4 formats x 2 steady calls
