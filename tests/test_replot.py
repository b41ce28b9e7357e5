"""benchmarks/replot.py: a committed side-by-side page's tables read back exactly, and its figures redrawn from them."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.replot import read_page, replot

PAGE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "side_by_side.md"


def test_the_tables_of_a_committed_page_read_back_as_written() -> None:
    text = PAGE.read_text()
    results = read_page(text)
    first = results["contexts"][0]
    row = (
        f"| {first.target_tokens} | {first.prompt_tokens_p50} | {first.steady_p50_ms:.1f} | {first.steady_p99_ms:.1f} |"
    )
    assert row in text
    assert [c.target_tokens for c in results["contexts"]] == [8000, 32000, 128000]
    assert len(results["contexts_base_url"]) == 3
    direct = [r for r in results["levels"] if r.target == "direct"]
    assert [r.sessions for r in direct] == [32, 96, 192, 384]
    for r in results["levels"]:  # every row as the page prints it
        assert f"| {r.target} | {r.sessions} | {r.calls} | {r.errors} | {r.calls_per_s:.1f} |" in text
    assert results["tokens"] == 64 and results["token_rate"] == 100.0


def test_replot_writes_both_figures_beside_the_page(tmp_path: Path) -> None:
    page = tmp_path / "side_by_side.md"
    shutil.copy(PAGE, page)
    written = replot(page)
    assert sorted(p.name for p in written) == ["added_latency.png", "fraction_of_direct.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
