"""trainer/plots.py: the dependency-free line chart is a valid PNG with each series drawn in its colour."""

from __future__ import annotations

import struct
import zlib

import pytest

from trainer.plots import PALETTE, Series, chart, line_chart_png, number


def decode(data: bytes) -> tuple[int, int, bytes]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    raw = zlib.decompress(data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8])
    assert len(raw) == height * (1 + 3 * width)
    return width, height, raw


def test_two_series_are_drawn_in_their_colours() -> None:
    png = line_chart_png("loss", [Series("a", ((0, 1.0), (1, 0.5), (2, 0.25))), Series("b", ((0, 0.1), (2, 0.9)))])
    width, height, raw = decode(png)
    assert width >= 400 and height >= 200
    for color in PALETTE[:2]:
        assert raw.count(bytes(color)) > 50


def test_points_land_where_their_values_say() -> None:
    c = chart("t", [Series("up", ((0.0, 0.0), (10.0, 1.0)))])
    color = PALETTE[0]
    rows = [y for y in range(c.height) for x in range(84, 100) if c.pixel(x, y) == color]
    cols = [x for y in range(40, 60) for x in range(c.width) if c.pixel(x, y) == color]
    assert rows and min(rows) >= 200  # the low end is drawn near the bottom on the left ...
    assert cols and min(cols) >= 400  # ... and the high end near the top on the right


def test_constant_single_and_non_finite_values() -> None:
    decode(line_chart_png("flat", [Series("x", ((1.0, 3.0),))]))
    decode(line_chart_png("nan", [Series("x", ((1.0, float("nan")), (2.0, 1.0)))]))
    with pytest.raises(ValueError, match="no finite points"):
        line_chart_png("empty", [Series("x", ((1.0, float("inf")),))])
    with pytest.raises(ValueError, match="no finite points"):
        line_chart_png("none", [])


def test_number_labels_use_drawable_characters() -> None:
    assert number(0) == "0" and number(1234567.0) == "1.23e6" and number(0.000123) == "0.000123"
    assert number(1.5e-7) == "1.5e-7"
