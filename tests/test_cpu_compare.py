"""benchmarks/cpu_compare.py: one real round (the same tree under two labels, a small level through the base URL)
prints a row per label with a positive CPU per call and checked shards; a bad tree is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import cpu_compare

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_one_round_prints_a_row_per_tree_with_cpu_and_checked_shards(smollm2_tokenizer_dir: Path, capsys) -> None:
    argv = ["--model-dir", str(smollm2_tokenizer_dir), "--compare", f"a={ROOT}", f"b={ROOT}", "--targets", "base"]
    assert cpu_compare.main([*argv, "--sessions", "2", "--seconds", "3", "--rounds", "1", "--token-rate", "500"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| base |")]
    assert [r.split("|")[1:3] for r in rows] == [[" base ", " a "], [" base ", " b "]]
    for r in rows:
        cells = [c.strip() for c in r.split("|")]
        cpu_ms, calls_per_s, errors, check = float(cells[4]), float(cells[5]), int(cells[8]), cells[9]
        assert cpu_ms > 0 and calls_per_s > 0 and errors == 0 and check == "ok"


def test_a_folder_that_is_not_a_source_tree_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        cpu_compare.main(["--model-dir", str(tmp_path), "--compare", f"x={tmp_path}"])
    with pytest.raises(SystemExit):
        cpu_compare.main(["--model-dir", str(tmp_path)])


@pytest.mark.integration
def test_variants_run_the_tree_with_each_option_set(smollm2_tokenizer_dir: Path, capsys) -> None:
    argv = ["--model-dir", str(smollm2_tokenizer_dir), "--compare", f"a={ROOT}", "--targets", "base"]
    argv += ["--variants", "i1=harnessrl_stream_interval=1", "i64=harnessrl_stream_interval=64,harnessrl_workers=1"]
    assert cpu_compare.main([*argv, "--sessions", "2", "--seconds", "3", "--rounds", "1", "--token-rate", "500"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| base |")]
    assert [r.split("|")[2].strip() for r in rows] == ["i1", "i64"]
    assert all(r.split("|")[9].strip() == "ok" for r in rows)
    assert "Variant i64: `--set harnessrl_stream_interval=64 --set harnessrl_workers=1`." in out


def test_a_variant_without_options_is_refused(tmp_path: Path) -> None:
    for bad in ("i8", "i8=", "=harnessrl_stream_interval=8", "i8=harnessrl_stream_interval"):
        with pytest.raises(SystemExit):
            cpu_compare.main(["--model-dir", str(tmp_path), "--compare", f"a={ROOT}", "--variants", bad])
