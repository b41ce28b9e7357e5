"""benchmarks/first_calls.py: the page's rows, and its check that the cached lead gives a whole render's ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import first_calls


def test_a_small_run_prints_a_row_per_lead_with_the_same_ids_both_ways(smollm2_tokenizer_dir: Path, capsys) -> None:
    assert (
        first_calls.main(["--model-dir", str(smollm2_tokenizer_dir), "--leads", "300", "900", "--sessions", "3"]) == 0
    )
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| 300 ") or line.startswith("| 900 ")]
    assert len(rows) == 2 and "Same ids with and without the cache" in out
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert int(cells[1]) > int(cells[0]) // 2  # the lead is about its target size
        assert all(float(c) > 0 for c in cells[2:])


def test_one_session_cannot_show_a_cache(smollm2_tokenizer_dir: Path) -> None:
    with pytest.raises(SystemExit):
        first_calls.main(["--model-dir", str(smollm2_tokenizer_dir), "--sessions", "1"])
