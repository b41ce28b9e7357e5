"""A training run's report: PNG plots of every metric (matplotlib, :mod:`tasks.figures`) and one self-contained HTML
page.

Contract
--------
* Input: a run dir (``runs/train/<id>`` or ``runs/sft/<id>``) with ``metrics.jsonl`` (one JSON object per line:
  ``iteration``, ``phase``, ``step``, ``wall_s`` and any numeric metrics; see docs/evaluation.md) and,
  when present, ``config.json``, ``state.json`` and the eval outputs of ``trainer.evaluate`` (``eval/``). A partial
  run is fine: a line cut short by an interrupted write, or any line that is not a JSON object, is skipped and
  counted; rows without a ``phase`` are skipped the same way. An absent or empty log is an error.
* :func:`charts`: every numeric key of every phase is plotted (no list of known keys). Keys ``name`` and
  ``name/<part>`` (e.g. ``pass_at_1`` and ``pass_at_1/pi``) share one chart, one line each. The x axis is ``step``
  where every row of the phase has one and they never decrease, else ``iteration``, else the row's position. A
  ``<base>_mean`` line whose row also has ``<base>_std`` (same ``/<part>``) gets a shaded band of mean ± 1 std
  (e.g. ``reward_mean`` ± ``reward_std`` per iteration); ``<base>_std`` is still plotted on its own too.
* :func:`figure`: one chart as a figure: the title names the metric, the phase and the run, the y label the metric
  and its unit where the name says it (:func:`metric_label`).
* :func:`write_report` writes ``<phase>-<name>.png`` per chart and ``index.html`` (charts embedded as data URIs,
  a table of the last value of each key per phase, the eval comparison and its charts, ``state.json`` and the
  config) into ``RUN/report`` (or ``out``), and returns the page's path.

CLI: ``python -m trainer.report RUN [--out DIR]``.

Layout: reading, charts, HTML, CLI.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import math
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from matplotlib.figure import Figure

from tasks.figures import Series, line_figure, png

RESERVED: Final = frozenset({"iteration", "phase", "step"})
EVAL_FILES: Final = ("comparison.md", "pass_at_1.png", "tool_calls.png")

# ------------------------------------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Metrics:
    rows: tuple[dict[str, Any], ...]
    skipped: int  # lines that were not a JSON object with a phase (e.g. cut short by an interruption)


def _numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_metrics(path: Path) -> Metrics:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no metrics log (has the run logged a step yet?)")
    rows, skipped = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            skipped += 1
            continue
        if isinstance(row, dict) and isinstance(row.get("phase"), str):
            rows.append(row)
        else:
            skipped += 1
    if not rows:
        raise ValueError(f"{path}: no metrics rows ({skipped} unreadable lines)")
    return Metrics(tuple(rows), skipped)


# ------------------------------------------------------------------------------------------------ charts


@dataclass(frozen=True)
class Chart:
    phase: str
    name: str  # the key before any "/"
    x_label: str
    series: tuple[Series, ...]

    @property
    def file_name(self) -> str:
        return re.sub(r"[^a-z0-9_.-]+", "_", f"{self.phase}-{self.name}".lower()) + ".png"


def _x_axis(rows: Sequence[dict[str, Any]]) -> tuple[str, list[float]]:
    for key in ("step", "iteration"):
        xs = [r.get(key) for r in rows]
        if all(_numeric(x) for x in xs):
            values = [float(x) for x in xs]  # type: ignore[arg-type]  # checked numeric just above
            if all(a <= b for a, b in zip(values, values[1:], strict=False)):
                return key, values
    return "row", [float(i) for i in range(len(rows))]


def charts(rows: Sequence[dict[str, Any]]) -> list[Chart]:
    """One chart per (phase, key family) in first-seen order (see the module docstring)."""
    by_phase: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_phase[r["phase"]].append(r)
    out = []
    for phase, prows in by_phase.items():
        x_label, xs = _x_axis(prows)
        families: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
        bands: dict[str, dict[str, list[tuple[float, float, float]]]] = defaultdict(lambda: defaultdict(list))
        for x, row in zip(xs, prows, strict=True):
            for key, value in row.items():
                if key not in RESERVED and _numeric(value):
                    name, _, part = key.partition("/")
                    families[name][part or "all"].append((x, float(value)))
                    std = row.get(key.replace("_mean", "_std", 1)) if name.endswith("_mean") else None
                    if _numeric(std):
                        bands[name][part or "all"].append((x, value - std, value + std))
        for name, lines in families.items():
            series = tuple(
                Series(
                    k, tuple(v), tuple(bands[name][k]), f"{k} ± 1 {name[: -len('_mean')]}_std" if bands[name][k] else ""
                )
                for k, v in lines.items()
            )
            out.append(Chart(phase, name, x_label, series))
    return out


X_AXES: Final = {"step": "optimizer step", "iteration": "iteration", "row": "row of metrics.jsonl"}
UNITS: Final = {
    "pass_at_1": "fraction of episodes passed",
    "tool_calls_mean": "tool calls per episode",
    "reward_mean": "reward per episode",
    "reward_std": "reward per episode",
    "kl": "nats",
    "clip_ratio": "fraction of tokens",
    "episodes": "episodes",
    "samples": "sequences",
    "trained_tokens": "tokens",
    "tokens_per_s": "tokens/s",
    "seconds": "s",
}


def metric_label(name: str) -> str:
    """The y axis label of a metric: its name and, where known from the name, its unit."""
    unit = UNITS.get(name)
    if unit is None and (name.endswith("_s") or "seconds" in name):
        unit = "s"
    elif unit is None and name.endswith("_ms"):
        unit = "ms"
    return f"{name} ({unit})" if unit else name


def figure(chart: Chart, run: str = "") -> Figure:
    """The chart drawn (see the module docstring)."""
    on = f", run {run}" if run else ""
    return line_figure(
        f"{chart.name} per {X_AXES.get(chart.x_label, chart.x_label)} ({chart.phase} phase{on})",
        chart.series,
        xlabel=X_AXES.get(chart.x_label, chart.x_label),
        ylabel=metric_label(chart.name),
        # a fraction is drawn on its whole range, so a flat 0 or a small rise is not blown up to fill the axis
        ylim=(-0.02, 1.02) if UNITS.get(chart.name, "").startswith("fraction") else None,
    )


def last_values(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """phase -> key -> the last numeric value logged (with the iteration and step of its row)."""
    out: dict[str, dict[str, Any]] = defaultdict(dict)
    for r in rows:
        for key, value in r.items():
            if key not in RESERVED and _numeric(value):
                out[r["phase"]][key] = (value, r.get("iteration"), r.get("step"))
    return out


# ------------------------------------------------------------------------------------------------ HTML

STYLE: Final = (
    "body{font-family:sans-serif;margin:24px;color:#222}"
    "img{border:1px solid #ddd;margin:4px;width:640px;max-width:100%}"
    "table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}"
    "th{background:#f3f3f3}pre{background:#f7f7f7;padding:8px;overflow:auto}"
)


def _img(data: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'


def _table(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in body)
    return f"<table><tr>{cells}</tr>{trs}</table>"


def markdown_to_html(text: str) -> str:
    """The subset ``trainer.evaluate`` writes: pipe tables and plain paragraphs."""
    parts, table = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            table.append([c.strip() for c in line.strip().strip("|").split("|")])
            continue
        if table:
            body = [r for r in table[1:] if not all(set(c) <= set("-:") for c in r)]
            parts.append(_table(table[0], body))
            table = []
        if line.strip():
            parts.append(f"<p>{html.escape(line)}</p>")
    return "\n".join(parts)


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _json_block(path: Path) -> str:
    if not path.is_file():
        return "<p>(none)</p>"
    return f"<pre>{html.escape(path.read_text())}</pre>"


def render_html(run: Path, metrics: Metrics, pngs: Sequence[tuple[Chart, bytes]]) -> str:
    title = f"harnessrl run {run.name}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"]
    parts.append(f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>")
    parts.append(f"<p>{len(metrics.rows)} metrics rows from {html.escape(str(run / 'metrics.jsonl'))}")
    parts.append(f"; {metrics.skipped} unreadable lines skipped.</p>" if metrics.skipped else ".</p>")
    parts.append("<h2>Last values</h2>")
    for phase, values in last_values(metrics.rows).items():
        body = [[k, _fmt(v), _fmt(it), _fmt(st)] for k, (v, it, st) in values.items()]
        parts.append(f"<h3>{html.escape(phase)}</h3>" + _table(["metric", "value", "iteration", "step"], body))
    parts.append("<h2>Plots</h2>")
    for phase in dict.fromkeys(c.phase for c, _ in pngs):
        parts.append(f"<h3>{html.escape(phase)}</h3><div>")
        parts += [_img(data, f"{c.phase} {c.name} vs {c.x_label}") for c, data in pngs if c.phase == phase]
        parts.append("</div>")
    eval_dir = run / "eval"
    if (eval_dir / "comparison.md").is_file():
        parts.append("<h2>Evaluation: before / after</h2>")
        parts.append(markdown_to_html((eval_dir / "comparison.md").read_text()))
        parts += [_img((eval_dir / n).read_bytes(), n) for n in EVAL_FILES[1:] if (eval_dir / n).is_file()]
    parts.append("<h2>State</h2>" + _json_block(run / "state.json"))
    parts.append("<h2>Config</h2>" + _json_block(run / "config.json"))
    parts.append("</body></html>\n")
    return "".join(parts)


def write_report(run: Path, out: Path | None = None) -> Path:
    """Plots and ``index.html`` for ``run`` (see the module docstring); returns the page's path."""
    metrics = read_metrics(run / "metrics.jsonl")
    dest = out or run / "report"
    dest.mkdir(parents=True, exist_ok=True)
    pngs = []
    for chart in charts(metrics.rows):
        data = png(figure(chart, run.name))
        (dest / chart.file_name).write_bytes(data)
        pngs.append((chart, data))
    page = dest / "index.html"
    page.write_text(render_html(run, metrics, pngs))
    return page


# ------------------------------------------------------------------------------------------------ CLI


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.report", description=__doc__.splitlines()[0])
    p.add_argument("run", type=Path, help="a run dir holding metrics.jsonl (runs/train/<id>, runs/sft/<id>)")
    p.add_argument("--out", type=Path, default=None, help="default: RUN/report")
    args = p.parse_args(argv)
    try:
        page = write_report(args.run, args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"report: {e}", file=sys.stderr)
        return 2
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
