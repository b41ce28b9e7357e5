"""A dependency-free bar chart as PNG bytes (the proxy env has no matplotlib): zlib + struct and a pixel buffer.

Contract
--------
``bar_chart_png(title, bars, vmax=None)`` draws one labelled bar per ``(label, value)`` (values >= 0), its value
printed above it, on a white canvas with the title on top, and returns an 8-bit RGB PNG. Bar heights are
``value / vmax`` of the plot height (``vmax`` defaults to the largest value). Text uses a built-in 3x5 pixel font
drawn at twice its size: lower-case letters, digits and ``. - @ % / _ :``; any other character is drawn as ``?``.

Layout: font, canvas, PNG encoding, the chart.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

Color = tuple[int, int, int]
WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
BAR: Color = (70, 110, 180)

# Each glyph: five rows of three bits (most significant bit = left pixel), one octal digit per row.
_GLYPHS = dict(
    zip(
        "0123456789abcdefghijklmnopqrstuvwxyz.- @%/_?:",
        "75557 26227 71747 71717 55711 74717 74757 71111 75757 75717 25755 65656 34443 65556 74647 74644 34553 "
        "55755 72227 11152 55655 44447 57755 65555 25552 65644 25563 65655 34216 72222 55557 55552 55775 55255 "
        "55222 71247 00002 00700 00000 25743 51245 11244 00007 71202 02020".split(),
        strict=True,
    )
)
SCALE = 2
ADVANCE = 4 * SCALE  # glyph width 3 plus one column of space


def text_width(text: str) -> int:
    return len(text) * ADVANCE


@dataclass
class Canvas:
    """An RGB pixel buffer, row-major, three bytes per pixel."""

    width: int
    height: int

    def __post_init__(self) -> None:
        self.pixels = bytearray(bytes(WHITE) * (self.width * self.height))

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill [x0, x1) x [y0, y1), clipped to the canvas."""
        x0, x1 = max(0, x0), min(self.width, x1)
        for y in range(max(0, y0), min(self.height, y1)):
            start = (y * self.width + x0) * 3
            self.pixels[start : start + 3 * max(0, x1 - x0)] = bytes(color) * max(0, x1 - x0)

    def text(self, x: int, y: int, text: str, color: Color = BLACK) -> None:
        for i, ch in enumerate(text.lower()):
            rows = _GLYPHS.get(ch, _GLYPHS["?"])
            for r, bits in enumerate(rows):
                for c in range(3):
                    if int(bits) >> (2 - c) & 1:
                        px, py = x + i * ADVANCE + c * SCALE, y + r * SCALE
                        self.rect(px, py, px + SCALE, py + SCALE, color)

    def pixel(self, x: int, y: int) -> Color:
        i = (y * self.width + x) * 3
        return (self.pixels[i], self.pixels[i + 1], self.pixels[i + 2])

    def png(self) -> bytes:
        stride = self.width * 3
        raw = b"".join(b"\x00" + bytes(self.pixels[y * stride : (y + 1) * stride]) for y in range(self.height))
        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB, no interlace
        return (
            b"\x89PNG\r\n\x1a\n"
            + _chunk(b"IHDR", header)
            + _chunk(b"IDAT", zlib.compress(raw, 9))
            + _chunk(b"IEND", b"")
        )


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


PLOT_TOP, PLOT_HEIGHT, MARGIN = 44, 150, 20


def chart(title: str, bars: Sequence[tuple[str, float]], vmax: float | None = None) -> Canvas:
    """The chart as a canvas (see the module docstring); :func:`bar_chart_png` encodes it."""
    if not bars:
        raise ValueError("a bar chart needs at least one bar")
    if any(not math.isfinite(v) or v < 0 for _, v in bars):
        raise ValueError(f"bar values must be finite and >= 0, got {[v for _, v in bars]}")
    top = vmax if vmax is not None else max(v for _, v in bars)
    top = top if top > 0 else 1.0
    slot = max(80, max(text_width(label) for label, _ in bars) + 16)
    width = max(2 * MARGIN + slot * len(bars), text_width(title) + 2 * MARGIN)
    canvas = Canvas(width, PLOT_TOP + PLOT_HEIGHT + 40)
    canvas.text(MARGIN, 12, title)
    base = PLOT_TOP + PLOT_HEIGHT
    canvas.rect(MARGIN // 2, base, width - MARGIN // 2, base + 1, BLACK)
    for i, (label, value) in enumerate(bars):
        x = MARGIN + i * slot
        h = round(PLOT_HEIGHT * min(value, top) / top)
        canvas.rect(x + 12, base - h, x + slot - 12, base, BAR)
        shown = f"{value:.2f}"
        canvas.text(x + (slot - text_width(shown)) // 2, base - h - 14, shown)
        canvas.text(x + (slot - text_width(label)) // 2, base + 8, label)
    return canvas


def bar_chart_png(title: str, bars: Sequence[tuple[str, float]], vmax: float | None = None) -> bytes:
    return chart(title, bars, vmax).png()
