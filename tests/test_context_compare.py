"""benchmarks/context_compare.py: one real round (both engine speeds, the same tree under two labels, a small
context) prints a row per speed x label with positive added latencies; a bad tree is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import context_compare

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_one_round_prints_a_row_per_engine_speed_and_tree(smollm2_tokenizer_dir: Path, capsys) -> None:
    argv = ["--model-dir", str(smollm2_tokenizer_dir), "--compare", f"a={ROOT}", f"b={ROOT}", "--contexts", "1500"]
    assert context_compare.main([*argv, "--calls", "2", "--rounds", "1", "--token-rate", "500"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| instant |", "| paced |"))]
    assert [r.split("|")[1:4] for r in rows] == [
        [" instant ", " 1500 ", " a "],
        [" instant ", " 1500 ", " b "],
        [" paced ", " 1500 ", " a "],
        [" paced ", " 1500 ", " b "],
    ]
    for r in rows:
        prompt, p50 = (float(c) for c in r.split("|")[4:6])
        assert prompt > 1000 and p50 > 0


def test_a_folder_that_is_not_a_source_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        context_compare.main(["--model-dir", str(tmp_path), "--compare", f"x={tmp_path}"])
    with pytest.raises(SystemExit):
        context_compare.main(["--model-dir", str(tmp_path)])
