"""tasks/barchart.py: the PNG is valid (chunks, CRCs, image data) and the bars are drawn to scale."""

from __future__ import annotations

import struct
import zlib

import pytest

from tasks.barchart import BAR, PLOT_HEIGHT, PLOT_TOP, WHITE, bar_chart_png, chart


def decode(png: bytes) -> tuple[int, int, bytes]:
    """Width, height and raw RGB pixels of an 8-bit RGB, filter-0 PNG; checks the signature and every CRC."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", png[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + data), kind
        chunks.append((kind, data))
        pos += 12 + length
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    width, height, depth, color, *_ = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, color) == (8, 2)
    raw = zlib.decompress(chunks[1][1])
    stride = 1 + 3 * width
    assert len(raw) == height * stride and all(raw[y * stride] == 0 for y in range(height))
    return width, height, b"".join(raw[y * stride + 1 : (y + 1) * stride] for y in range(height))


def bar_height(canvas, x: int) -> int:
    base = PLOT_TOP + PLOT_HEIGHT
    return sum(1 for y in range(PLOT_TOP - 20, base) if canvas.pixel(x, y) == BAR)


def test_png_is_valid_and_matches_the_canvas() -> None:
    png = bar_chart_png("pass@1 per harness", [("pi", 0.5), ("mini-swe-agent", 0.25)], vmax=1.0)
    canvas = chart("pass@1 per harness", [("pi", 0.5), ("mini-swe-agent", 0.25)], vmax=1.0)
    width, height, pixels = decode(png)
    assert (width, height) == (canvas.width, canvas.height)
    assert pixels == bytes(canvas.pixels)
    assert canvas.pixel(0, 0) == WHITE


def test_bars_are_drawn_to_scale() -> None:
    canvas = chart("t", [("a", 1.0), ("b", 0.5), ("c", 0.0)], vmax=2.0)
    slot = (canvas.width - 40) // 3
    heights = [bar_height(canvas, 20 + i * slot + slot // 2) for i in range(3)]
    assert heights == [round(PLOT_HEIGHT / 2), round(PLOT_HEIGHT / 4), 0]
    scaled = chart("t", [("a", 4.0), ("b", 2.0)])  # vmax defaults to the largest value
    assert bar_height(scaled, 20 + 40) == PLOT_HEIGHT


def test_text_is_drawn_and_unknown_characters_still_render() -> None:
    canvas = chart("TITLE ~", [("x", 1.0)])
    assert any(canvas.pixel(x, y) != WHITE for x in range(20, 80) for y in range(12, 22))


@pytest.mark.parametrize("bars", [[], [("a", -1.0)], [("a", float("nan"))]])
def test_bad_bars_are_rejected(bars: list) -> None:
    with pytest.raises(ValueError):
        chart("t", bars)
