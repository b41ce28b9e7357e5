"""tasks/figures.py: the 95% intervals, the bar and line figures read back from their artists, the PNG they
render, and no pyplot anywhere."""

from __future__ import annotations

import io
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.patches import Rectangle
from PIL import Image

from tasks.figures import (
    DPI,
    HEIGHT_IN,
    WIDTH_IN,
    BarSeries,
    Series,
    _t_95,
    bar_figure,
    line_figure,
    mean_interval,
    png,
    wilson_interval,
)

ROOT = Path(__file__).resolve().parent.parent


def bars_of(fig) -> list[Rectangle]:
    return [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]


def error_segments(fig) -> list[tuple[float, float, float]]:
    """(x, low, high) of every error bar drawn."""
    out = []
    for coll in fig.axes[0].collections:
        if isinstance(coll, LineCollection):
            out += [(seg[0][0], seg[0][1], seg[1][1]) for seg in coll.get_segments()]
    return out


# ------------------------------------------------------------------------------------------------ intervals


def test_wilson_interval_matches_the_formula_and_known_values() -> None:
    low, high = wilson_interval(1, 4)  # type: ignore[misc]
    assert (low, high) == (pytest.approx(0.045587, abs=1e-6), pytest.approx(0.699358, abs=1e-6))
    low, high = wilson_interval(5, 10)  # type: ignore[misc]
    assert low == pytest.approx(0.236593, abs=1e-6) and high == pytest.approx(1 - low)  # symmetric at 1/2
    assert wilson_interval(0, 10) == (0.0, pytest.approx(0.277533, abs=1e-6))
    assert wilson_interval(10, 10) == (pytest.approx(0.722467, abs=1e-6), 1.0)
    assert wilson_interval(0, 0) is None
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_mean_interval_uses_students_t() -> None:
    values = [2.0, 0.0, 4.0, 1.0]
    half = 3.1824 * statistics.stdev(values) / 2  # t(0.975, 3 df) * s / sqrt(4)
    low, high = mean_interval(values)  # type: ignore[misc]
    assert (low, high) == (pytest.approx(1.75 - half), pytest.approx(1.75 + half))
    assert mean_interval([3.0, 3.0]) == (3.0, 3.0)
    assert mean_interval([1.0]) is None and mean_interval([]) is None


@pytest.mark.parametrize(("df", "exact"), [(1, 12.7062), (30, 2.0423), (31, 2.0395), (40, 2.0211), (120, 1.9799)])
def test_t_quantiles_table_and_expansion(df: int, exact: float) -> None:
    assert _t_95(df) == pytest.approx(exact, abs=1e-4)
    assert _t_95(10**6) == pytest.approx(1.95996, abs=1e-4)
    with pytest.raises(ValueError):
        _t_95(0)


# ------------------------------------------------------------------------------------------------ bars


def test_bar_figure_draws_values_intervals_labels_and_title() -> None:
    fig = bar_figure(
        "pass@1 per harness\n10 episodes",
        ["pi", "mini-swe-agent"],
        [BarSeries("pass@1", (0.5, 0.25), ((0.2, 0.8), None))],
        ylabel="pass@1 (fraction)",
        xlabel="harness",
        ymax=1.0,
    )
    ax = fig.axes[0]
    assert ax.get_title(loc="left") == "pass@1 per harness\n10 episodes"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("harness", "pass@1 (fraction)")
    assert [b.get_height() for b in bars_of(fig)] == [0.5, 0.25]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["pi", "mini-swe-agent"]
    assert [t.get_text() for t in ax.texts] == ["0.50", "0.25"]
    x = bars_of(fig)[0].get_x() + bars_of(fig)[0].get_width() / 2
    segments = error_segments(fig)
    assert (pytest.approx(x), pytest.approx(0.2), pytest.approx(0.8)) in segments
    assert all(high <= 0.8 + 1e-9 for _, _, high in segments)  # the missing interval draws nothing above its bar
    assert ax.get_ylim()[1] >= 1.0 and not fig.legends  # one series: no legend


def test_grouped_bars_missing_values_and_negative_values() -> None:
    fig = bar_figure(
        "t",
        ["a", "b"],
        [BarSeries("before", (1.0, math.nan)), BarSeries("after", (2.0, -0.5), color="#123456")],
        ylabel="y",
        value_format="{:.1f}",
    )
    rects = bars_of(fig)
    assert [r.get_height() for r in rects] == [1.0, 0.0, 2.0, -0.5]
    assert rects[0].get_x() < rects[2].get_x() < rects[1].get_x() < rects[3].get_x()  # grouped by category
    assert rects[2].get_facecolor()[:3] != rects[0].get_facecolor()[:3]
    assert rects[3].get_facecolor()[:3] == pytest.approx((0x12 / 255, 0x34 / 255, 0x56 / 255))
    assert [t.get_text() for t in fig.axes[0].texts] == ["1.0", "n/a", "2.0", "-0.5"]
    assert fig.axes[0].get_ylim()[0] < -0.5
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["before", "after"]


@pytest.mark.parametrize(
    ("categories", "series"),
    [
        ([], [BarSeries("a", ())]),
        (["a"], []),
        (["a", "b"], [BarSeries("a", (1.0,))]),
        (["a"], [BarSeries("a", (1.0,), ((0.0, 1.0), None))]),
        (["a"], [BarSeries("a", (math.inf,))]),
    ],
)
def test_bad_bars_are_rejected(categories: list[str], series: list[BarSeries]) -> None:
    with pytest.raises(ValueError):
        bar_figure("t", categories, series, ylabel="y")


def test_png_decodes_at_the_figure_size() -> None:
    fig = bar_figure("t", ["a"], [BarSeries("a", (1.0,))], ylabel="y")
    image = Image.open(io.BytesIO(png(fig)))
    assert image.format == "PNG"
    assert image.size == (round(WIDTH_IN * DPI), round(HEIGHT_IN * DPI))
    assert image.convert("RGB").getpixel((1, 1)) == (255, 255, 255)  # a white background, not transparent


# ------------------------------------------------------------------------------------------------ lines


def test_line_figure_draws_each_series_and_its_band() -> None:
    fig = line_figure(
        "reward per iteration",
        [
            Series("all", ((1, 0.2), (2, 0.4), (3, 0.5)), band=((1, 0.1, 0.3), (2, 0.2, 0.6)), band_label="± 1 std"),
            Series("pi", ((1, 0.1), (3, 0.9))),
        ],
        xlabel="iteration",
        ylabel="reward",
    )
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert [line.get_label() for line in lines] == ["all", "pi"]
    assert list(lines[0].get_xdata()) == [1, 2, 3] and list(lines[0].get_ydata()) == [0.2, 0.4, 0.5]
    assert list(lines[1].get_ydata()) == [0.1, 0.9]
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    ys = band.get_paths()[0].vertices[:, 1]
    assert min(ys) == pytest.approx(0.1) and max(ys) == pytest.approx(0.6)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["± 1 std", "all", "pi"]
    assert all(float(t).is_integer() for t in ax.xaxis.get_major_locator().tick_values(1, 3))
    assert (ax.get_title(loc="left"), ax.get_xlabel(), ax.get_ylabel()) == (
        "reward per iteration",
        "iteration",
        "reward",
    )


def test_non_finite_points_are_dropped_and_an_empty_figure_is_an_error() -> None:
    fig = line_figure("nan", [Series("x", ((1.0, math.nan), (2.0, 1.0)))], xlabel="x", ylabel="y")
    (line,) = fig.axes[0].get_lines()
    assert list(line.get_xdata()) == [2.0] and not fig.legends  # one plain series: no legend
    Image.open(io.BytesIO(png(line_figure("flat", [Series("x", ((1.0, 3.0),))], xlabel="x", ylabel="y"))))
    with pytest.raises(ValueError, match="no finite points"):
        line_figure("empty", [Series("x", ((1.0, math.inf),))], xlabel="x", ylabel="y")
    with pytest.raises(ValueError, match="no finite points"):
        line_figure("none", [], xlabel="x", ylabel="y")


def test_long_title_lines_wrap() -> None:
    fig = line_figure("word " * 40, [Series("x", ((0.0, 1.0),))], xlabel="x", ylabel="y")
    assert fig.axes[0].get_title(loc="left").count("\n") >= 1


def test_no_pyplot_and_the_agg_backend() -> None:
    code = (
        "import sys, matplotlib; from tasks.figures import BarSeries, bar_figure, png; "
        "png(bar_figure('t', ['a'], [BarSeries('a', (1.0,))], ylabel='y')); "
        "assert 'matplotlib.pyplot' not in sys.modules; print(matplotlib.get_backend())"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip().lower() == "agg"


def test_a_line_figure_can_fix_its_y_range() -> None:
    flat = [Series("all", ((1, 0.0), (2, 0.0), (3, 0.0)))]
    assert line_figure("t", flat, xlabel="x", ylabel="y", ylim=(-0.02, 1.02)).axes[0].get_ylim() == (-0.02, 1.02)
    # without it matplotlib pads a flat line symmetrically (a fraction would show negative ticks)
    assert line_figure("t", flat, xlabel="x", ylabel="y").axes[0].get_ylim()[0] < -0.02
