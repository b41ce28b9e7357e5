"""benchmarks/tokenizer_paths.py: a row per pre-tokeniser and text, each with both timings and the same ids."""

from __future__ import annotations

from pathlib import Path

from benchmarks import tokenizer_paths


def test_each_pre_tokeniser_is_taken_and_timed_both_ways(smollm2_tokenizer_dir: Path, capsys) -> None:
    assert tokenizer_paths.main(["--model-dir", str(smollm2_tokenizer_dir), "--repeat", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows[1:]]
    assert [c[:2] for c in cells] == [
        [name, text] for name in ("GPT-2", "Llama 3", "Qwen 2") for text in ("2,000 characters", "500 KB")
    ]
    for c in cells:
        assert float(c[2]) > 0 and float(c[3]) > 0 and c[4].endswith("x") and float(c[5]) > 0
