"""Redraw a side-by-side page's figures from the tables on the page itself.

A committed ``side_by_side.md`` holds every figure its charts show (the added-latency table per context and route,
the throughput table per target and load level), so its PNGs can be redrawn with the current plotting code
(``benchmarks.side_by_side.page_figures``, matplotlib) without rerunning a 30-minute benchmark. Nothing is computed
here beyond reading the numbers back; the page's own text is left as it is.

    python benchmarks/replot.py benchmarks/results/side_by_side.md [more pages...]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.side_by_side import ContextRow, LevelRow, page_figures  # noqa: E402
from tasks.figures import png  # noqa: E402

_ENGINE = re.compile(r"Fake engine: (\d+) tokens per answer(?: at ([\d.]+) tokens/s)?")


def _rows(lines: list[str], start: int) -> list[list[str]]:
    """The body rows of the markdown table whose header is ``lines[start]``."""
    out = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        out.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return out


def read_page(text: str) -> dict[str, Any]:
    """The ``results`` that :func:`page_figures` draws, read back from a page written by ``write_page``."""
    lines = text.splitlines()
    context_headers = [i for i, line in enumerate(lines) if line.startswith("| context (target tokens)")]
    level_header = next(i for i, line in enumerate(lines) if line.startswith("| target | sessions |"))
    sweeps = [
        [ContextRow(int(r[0]), int(r[1]), float(r[2]), float(r[3]), float(r[4]), float(r[5]), int(r[6])) for r in rows]
        for rows in (_rows(lines, i) for i in context_headers)
    ]
    levels = [
        LevelRow(
            target=r[0],
            sessions=int(r[1]),
            calls=int(r[2]),
            errors=int(r[3]),
            calls_per_s=float(r[4]),
            p50_ms=float(r[6]),
            p99_ms=float(r[7]),
            cpu_s_per_call=float(r[8].removesuffix(" ms")) / 1e3,
            rss_mib_per_session=float(r[9]),
            load=float(r[10]),
            verdict_ok=None if not r[11] else r[11] == "ok",
            error_kinds=r[12] if len(r) > 12 else "",
        )
        for r in _rows(lines, level_header)
    ]
    results: dict[str, Any] = {"contexts": sweeps[0], "levels": levels}
    if len(sweeps) > 1:
        results["contexts_base_url"] = sweeps[1]
    engine = _ENGINE.search(text)
    if engine:
        results["tokens"] = int(engine[1])
        if engine[2]:
            results["token_rate"] = float(engine[2])
    return results


def replot(page: Path) -> list[Path]:
    written = []
    for name, fig in page_figures(read_page(page.read_text())).items():
        path = page.parent / f"{name}.png"
        path.write_bytes(png(fig))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", type=Path, nargs="+", help="side_by_side.md pages; the PNGs are written beside each")
    args = ap.parse_args(argv)
    for page in args.pages:
        for path in replot(page):
            print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
