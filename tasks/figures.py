"""Figures as PNG bytes, drawn with matplotlib's Agg backend, and the 95% intervals they show.

Contract
--------
* Every figure is a :class:`matplotlib.figure.Figure` on a ``FigureCanvasAgg``, never through pyplot: no global
  figure registry, nothing to close, no display needed, safe to call from any thread. :func:`png` renders one to
  PNG bytes (RGBA, :data:`DPI`). Importing this module selects the Agg backend for anyone who later imports pyplot.
* One style everywhere (:func:`new_axes`): a title that says what was measured and on what (the caller writes it;
  each line wraps at :data:`TITLE_CHARS`), axis labels with units, 9-13 pt DejaVu Sans, a light horizontal grid,
  no top/right frame, a legend below the plot when there is more than one series, and a constrained layout so
  nothing is cut off.
* :func:`bar_figure` draws grouped bars: one group per category, one bar per :class:`BarSeries` in each group, the
  value written above each bar and, where the series has one, its 95% interval as an error bar. A NaN value is a
  missing bar (written ``n/a``); any other non-finite value is an error, as is a figure with no category.
* :func:`line_figure` draws each :class:`Series` as a line with a marker on every point and, where it has a
  ``band``, the spread around it as a shaded area. Non-finite points are dropped; a figure with no finite point
  left is an error.
* :func:`wilson_interval` (a proportion) and :func:`mean_interval` (a mean: Student's t on the sample standard
  deviation) are the 95% intervals the callers draw; both return None when there is nothing to estimate from.

Layout: intervals, style, bars, lines.
"""

from __future__ import annotations

import io
import math
import statistics
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import matplotlib

matplotlib.use("Agg")

from matplotlib.axes import Axes  # noqa: E402  # after the backend is chosen
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

Interval = tuple[float, float]

# ------------------------------------------------------------------------------------------------ intervals

Z_95: Final = 1.959963984540054  # the standard normal's 97.5% quantile
# Student's t 97.5% quantiles for 1..30 degrees of freedom; above 30 the Cornish-Fisher expansion in _t_95 is
# within 1e-4 of the exact value.
_T_95: Final = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604, 2.1448,
    2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484,
    2.0452, 2.0423,
)  # fmt: skip


def _t_95(df: int) -> float:
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T_95):
        return _T_95[df - 1]
    z = Z_95
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def wilson_interval(successes: int, n: int) -> Interval | None:
    """The 95% Wilson score interval of a proportion ``successes / n``; None for ``n == 0``."""
    if n == 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, {n}], got {successes}")
    p, z2 = successes / n, Z_95**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z_95 / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    return low, 1.0 if successes == n else min(1.0, centre + half)


def mean_interval(values: Sequence[float]) -> Interval | None:
    """The 95% interval of the mean of ``values`` (Student's t, n - 1 degrees of freedom); None below two values."""
    n = len(values)
    if n < 2:
        return None
    mean = statistics.fmean(values)
    half = _t_95(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean - half, mean + half


# ------------------------------------------------------------------------------------------------ style

WIDTH_IN, HEIGHT_IN, DPI = 8.0, 4.5, 110  # 880 x 495 px
TITLE_PT, LABEL_PT, TICK_PT, NOTE_PT = 13, 11, 10, 9
PALETTE: Final = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")
TITLE_CHARS = 78  # a longer title line wraps (82 ran past the right edge of a left-aligned title)


def new_axes(title: str, xlabel: str, ylabel: str) -> tuple[Figure, Axes]:
    """A figure in the shared style with one axes, its title and axis labels set."""
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    wrapped = "\n".join(textwrap.fill(line, TITLE_CHARS) for line in title.splitlines())
    ax.set_title(wrapped, fontsize=TITLE_PT, loc="left")
    ax.set_xlabel(xlabel, fontsize=LABEL_PT)
    ax.set_ylabel(ylabel, fontsize=LABEL_PT)
    ax.tick_params(labelsize=TICK_PT)
    ax.grid(axis="y", color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return fig, ax


def _legend(fig: Figure, entries: int) -> None:
    """The legend below the plot, in up to four columns (the constrained layout makes room for it)."""
    fig.legend(fontsize=NOTE_PT, loc="outside lower center", ncols=min(4, entries), frameon=False)


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")
    return buf.getvalue()


# ------------------------------------------------------------------------------------------------ bars


@dataclass(frozen=True)
class BarSeries:
    """One bar per category; ``intervals`` (empty, or one per value) are the 95% error bars."""

    label: str  # the legend entry; a figure with one series shows no legend
    values: tuple[float, ...]
    intervals: tuple[Interval | None, ...] = ()
    color: str = ""  # default: the series' place in PALETTE


def bar_figure(
    title: str,
    categories: Sequence[str],
    series: Sequence[BarSeries],
    *,
    ylabel: str,
    xlabel: str = "",
    ymax: float | None = None,
    value_format: str = "{:.2f}",
) -> Figure:
    """Grouped bars (see the module docstring); ``ymax`` fixes the top of the y axis (e.g. 1 for a fraction)."""
    if not categories or not series:
        raise ValueError(f"bar figure {title!r}: needs at least one category and one series")
    for s in series:
        if len(s.values) != len(categories) or (s.intervals and len(s.intervals) != len(categories)):
            raise ValueError(f"bar series {s.label!r}: one value (and interval) per category, {len(categories)}")
        if any(math.isinf(v) for v in s.values):
            raise ValueError(f"bar series {s.label!r}: values must be finite or NaN, got {s.values}")
    fig, ax = new_axes(title, xlabel, ylabel)
    width = 0.8 / len(series)
    tops = [0.0]
    for i, s in enumerate(series):
        xs = [c + (i - (len(series) - 1) / 2) * width for c in range(len(categories))]
        heights = [0.0 if math.isnan(v) else v for v in s.values]
        bars = ax.bar(xs, heights, width * 0.92, label=s.label or None, color=s.color or PALETTE[i % len(PALETTE)])
        tops += heights
        highs = heights
        if any(iv is not None for iv in s.intervals):
            lows = [h - iv[0] if iv else 0.0 for h, iv in zip(heights, s.intervals, strict=True)]
            ups = [iv[1] - h if iv else 0.0 for h, iv in zip(heights, s.intervals, strict=True)]
            ax.errorbar(xs, heights, yerr=[lows, ups], fmt="none", ecolor="#333333", elinewidth=1.2, capsize=4)
            highs = [iv[1] if iv else h for h, iv in zip(heights, s.intervals, strict=True)]
            tops += highs
        texts = ["n/a" if math.isnan(v) else value_format.format(v) for v in s.values]
        for bar, high, text in zip(bars, highs, texts, strict=True):
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, max(high, 0.0)), xytext=(0, 3),
                        textcoords="offset points", ha="center", va="bottom", fontsize=NOTE_PT)  # fmt: skip
    if sum(len(c) for c in categories) > 70:  # long labels would overlap: one line each, slanted, ending at the tick
        ax.set_xticks(range(len(categories)), [c.replace("\n", " ") for c in categories])
        for label in ax.get_xticklabels():
            label.set(rotation=35, horizontalalignment="right", rotation_mode="anchor")
    else:
        ax.set_xticks(range(len(categories)), list(categories))
    ax.axhline(0, color="#333333", linewidth=0.8)
    low = min(0.0, *tops)
    top = max(tops) if ymax is None else max(ymax, *tops)
    ax.set_ylim(low * 1.12, (top or 1.0) * 1.12)  # room for the value labels above the bars
    if len(series) > 1:
        _legend(fig, len(series))
    return fig


# ------------------------------------------------------------------------------------------------ lines


@dataclass(frozen=True)
class Series:
    """A line: ``points`` are ``(x, y)``, x ascending; ``band`` are ``(x, low, high)``, shaded and labelled
    ``band_label`` (e.g. "mean ± 1 std")."""

    label: str
    points: tuple[tuple[float, float], ...]
    band: tuple[tuple[float, float, float], ...] = ()
    band_label: str = ""


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


def line_figure(
    title: str, series: Sequence[Series], *, xlabel: str, ylabel: str, ylim: tuple[float, float] | None = None
) -> Figure:
    """Lines with markers and optional bands (see the module docstring); ``ylim`` fixes the y axis (fractions: 0-1)."""
    kept = [
        Series(
            s.label,
            tuple(p for p in s.points if _finite(*p)),
            tuple(b for b in s.band if _finite(*b)),
            s.band_label,
        )
        for s in series
    ]
    kept = [s for s in kept if s.points]
    if not kept:
        raise ValueError(f"line figure {title!r}: no finite points to draw")
    fig, ax = new_axes(title, xlabel, ylabel)
    for i, s in enumerate(kept):
        color = PALETTE[i % len(PALETTE)]
        if s.band:
            bx, lo, hi = zip(*s.band, strict=True)
            ax.fill_between(bx, lo, hi, color=color, alpha=0.18, linewidth=0, label=s.band_label or None)
        xs, ys = zip(*s.points, strict=True)
        ax.plot(xs, ys, color=color, marker="o", markersize=4, linewidth=1.8, label=s.label)
    if all(float(x).is_integer() for s in kept for x, _ in s.points):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ylim is not None:
        ax.set_ylim(*ylim)
    if len(kept) > 1 or any(s.band for s in kept):
        _legend(fig, len(kept) + sum(1 for s in kept if s.band))
    return fig
