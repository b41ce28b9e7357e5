"""Dependency-free line charts as PNG bytes, for training reports (no matplotlib in either env).

Contract
--------
``line_chart_png(title, series)`` draws each :class:`Series` (a label and its ``(x, y)`` points, x ascending) as a
coloured polyline with a dot on every point, on shared axes scaled to the data (a flat or single-valued range is
widened so it still has height), with the title on top, the y range and x range printed at the axis ends and a
legend below; it returns an 8-bit RGB PNG. Non-finite points are dropped; a chart with no finite point left is an
error. Text uses the pixel font of :mod:`tasks.barchart` (lower-case letters, digits and ``. - @ % / _ :``).

Layout: scaling, drawing, the chart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tasks.barchart import BLACK, Canvas, Color, text_width

PALETTE: tuple[Color, ...] = ((70, 110, 180), (200, 90, 40), (60, 150, 80), (160, 60, 160), (120, 120, 120))
GRID: Color = (225, 225, 225)
LEFT, TOP, PLOT_W, PLOT_H, RIGHT = 84, 40, 420, 180, 20
LEGEND_LINE = 16


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple[tuple[float, float], ...]


def _finite(series: Sequence[Series]) -> list[Series]:
    return [
        Series(s.label, tuple((x, y) for x, y in s.points if math.isfinite(x) and math.isfinite(y))) for s in series
    ]


def _span(values: Sequence[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if hi - lo < 1e-12:  # a constant metric still gets a visible band around it
        pad = abs(lo) * 0.1 or 1.0
        return lo - pad, hi + pad
    return lo, hi


def number(value: float) -> str:
    """A short label the pixel font can draw (no '+')."""
    if value == 0:
        return "0"
    text = f"{value:.3g}"
    return text.replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def _line(canvas: Canvas, a: tuple[int, int], b: tuple[int, int], color: Color) -> None:
    """A two-pixel-wide segment from ``a`` to ``b``."""
    (x0, y0), (x1, y1) = a, b
    steps = max(abs(x1 - x0), abs(y1 - y0), 1)
    for i in range(steps + 1):
        x = round(x0 + (x1 - x0) * i / steps)
        y = round(y0 + (y1 - y0) * i / steps)
        canvas.rect(x, y, x + 2, y + 2, color)


def chart(title: str, series: Sequence[Series]) -> Canvas:
    """The chart as a canvas (see the module docstring); :func:`line_chart_png` encodes it."""
    kept = [s for s in _finite(series) if s.points]
    if not kept:
        raise ValueError(f"line chart {title!r}: no finite points to draw")
    xs = [x for s in kept for x, _ in s.points]
    ys = [y for s in kept for _, y in s.points]
    (x_lo, x_hi), (y_lo, y_hi) = _span(xs), _span(ys)
    width = max(LEFT + PLOT_W + RIGHT, text_width(title) + 2 * RIGHT)
    height = TOP + PLOT_H + 36 + LEGEND_LINE * len(kept)
    canvas = Canvas(width, height)
    canvas.text(RIGHT, 12, title)
    bottom = TOP + PLOT_H
    for frac in (0.0, 0.5, 1.0):
        y = round(bottom - frac * PLOT_H)
        canvas.rect(LEFT, y, LEFT + PLOT_W, y + 1, GRID)
        label = number(y_lo + frac * (y_hi - y_lo))
        canvas.text(LEFT - 8 - text_width(label), y - 5, label)
    canvas.rect(LEFT, TOP, LEFT + 1, bottom + 1, BLACK)
    canvas.rect(LEFT, bottom, LEFT + PLOT_W, bottom + 1, BLACK)
    canvas.text(LEFT, bottom + 8, number(x_lo))
    canvas.text(LEFT + PLOT_W - text_width(number(x_hi)), bottom + 8, number(x_hi))

    def at(x: float, y: float) -> tuple[int, int]:
        return (
            LEFT + round((x - x_lo) / (x_hi - x_lo) * (PLOT_W - 2)),
            bottom - 2 - round((y - y_lo) / (y_hi - y_lo) * (PLOT_H - 2)),
        )

    for i, s in enumerate(kept):
        color = PALETTE[i % len(PALETTE)]
        pixels = [at(x, y) for x, y in s.points]
        for a, b in zip(pixels, pixels[1:], strict=False):
            _line(canvas, a, b, color)
        for px, py in pixels:
            canvas.rect(px - 1, py - 1, px + 3, py + 3, color)
        ly = bottom + 28 + i * LEGEND_LINE
        canvas.rect(LEFT, ly + 2, LEFT + 14, ly + 7, color)
        canvas.text(LEFT + 20, ly, s.label)
    return canvas


def line_chart_png(title: str, series: Sequence[Series]) -> bytes:
    return chart(title, series).png()
