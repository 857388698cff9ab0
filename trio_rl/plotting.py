"""Line plots as PNG files with nothing but the standard library.

A :class:`Canvas` is an RGB pixel buffer with lines, rectangles and text in a
built-in 3x5 bitmap font (digits, letters, a little punctuation; letters are
drawn upper-case). :func:`write_png` encodes a canvas with ``zlib`` and
``struct``; :func:`plot_series` draws curves with axes, ticks and a legend.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

Color = tuple[int, int, int]

WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GREY: Color = (200, 200, 200)

# 3x5 glyphs, one string of 5 rows of 3 columns each ("#" on, "." off).
_FONT_ROWS: dict[str, str] = {
    "0": "### #.# #.# #.# ###",
    "1": ".#. ##. .#. .#. ###",
    "2": "### ..# ### #.. ###",
    "3": "### ..# .## ..# ###",
    "4": "#.# #.# ### ..# ..#",
    "5": "### #.. ### ..# ###",
    "6": "### #.. ### #.# ###",
    "7": "### ..# .#. .#. .#.",
    "8": "### #.# ### #.# ###",
    "9": "### #.# ### ..# ###",
    "A": ".#. #.# ### #.# #.#",
    "B": "##. #.# ##. #.# ##.",
    "C": ".## #.. #.. #.. .##",
    "D": "##. #.# #.# #.# ##.",
    "E": "### #.. ##. #.. ###",
    "F": "### #.. ##. #.. #..",
    "G": ".## #.. #.# #.# .##",
    "H": "#.# #.# ### #.# #.#",
    "I": "### .#. .#. .#. ###",
    "J": "..# ..# ..# #.# .#.",
    "K": "#.# #.# ##. #.# #.#",
    "L": "#.. #.. #.. #.. ###",
    "M": "#.# ### ### #.# #.#",
    "N": "##. #.# #.# #.# #.#",
    "O": ".#. #.# #.# #.# .#.",
    "P": "##. #.# ##. #.. #..",
    "Q": ".#. #.# #.# ##. .##",
    "R": "##. #.# ##. #.# #.#",
    "S": ".## #.. .#. ..# ##.",
    "T": "### .#. .#. .#. .#.",
    "U": "#.# #.# #.# #.# ###",
    "V": "#.# #.# #.# #.# .#.",
    "W": "#.# #.# ### ### #.#",
    "X": "#.# #.# .#. #.# #.#",
    "Y": "#.# #.# .#. .#. .#.",
    "Z": "### ..# .#. #.. ###",
    ".": "... ... ... ... .#.",
    "-": "... ... ### ... ...",
    "_": "... ... ... ... ###",
    "/": "..# ..# .#. #.. #..",
    ":": "... .#. ... .#. ...",
    "=": "... ### ... ### ...",
    "+": "... .#. ### .#. ...",
    " ": "... ... ... ... ...",
}
FONT: dict[str, list[str]] = {ch: rows.split() for ch, rows in _FONT_ROWS.items()}
GLYPH_W, GLYPH_H = 3, 5
LEGEND_ROW_H = 14


class Canvas:
    """An RGB image, row-major, origin at the top left.

    Args:
        width, height: size in pixels.
        background: the fill colour.
    """

    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        if width <= 0 or height <= 0:
            raise ValueError("a canvas needs a positive width and height")
        self.width = width
        self.height = height
        self.pixels = bytearray(bytes(background) * (width * height))

    def get(self, x: int, y: int) -> Color:
        """The colour at ``(x, y)``."""
        i = 3 * (y * self.width + x)
        return (self.pixels[i], self.pixels[i + 1], self.pixels[i + 2])

    def set(self, x: int, y: int, color: Color) -> None:
        """Paint one pixel; points outside the canvas are ignored."""
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i : i + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill the rectangle with corners ``(x0, y0)`` and ``(x1, y1)``, both included."""
        for y in range(min(y0, y1), max(y0, y1) + 1):
            for x in range(min(x0, x1), max(x0, x1) + 1):
                self.set(x, y, color)

    def line(self, x0: int, y0: int, x1: int, y1: int, color: Color, width: int = 1) -> None:
        """Draw a straight line (Bresenham), ``width`` pixels thick."""
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        lo = -(width // 2)
        while True:
            for ox in range(lo, lo + width):
                for oy in range(lo, lo + width):
                    self.set(x0 + ox, y0 + oy, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2) -> int:
        """Write ``text`` with its top left at ``(x, y)``; unknown characters print as blanks.

        Returns:
            The x just after the last character.
        """
        for ch in text.upper():
            glyph = FONT.get(ch, FONT[" "])
            for row, bits in enumerate(glyph):
                for col, bit in enumerate(bits):
                    if bit == "#":
                        self.rect(x + col * scale, y + row * scale, x + col * scale + scale - 1, y + row * scale + scale - 1, color)
            x += (GLYPH_W + 1) * scale
        return x


def text_width(text: str, scale: int = 2) -> int:
    """Pixels that :meth:`Canvas.text` uses for ``text`` (including the trailing gap)."""
    return len(text) * (GLYPH_W + 1) * scale


def encode_png(canvas: Canvas) -> bytes:
    """The canvas as an 8-bit RGB PNG, no interlacing, filter 0 on every row."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    stride = 3 * canvas.width
    raw = b"".join(b"\x00" + bytes(canvas.pixels[y * stride : (y + 1) * stride]) for y in range(canvas.height))
    header = struct.pack(">IIBBBBB", canvas.width, canvas.height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def write_png(path: Path | str, canvas: Canvas) -> None:
    """Write ``canvas`` to ``path`` as a PNG (through a temporary file, so readers never see half of it)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(encode_png(canvas))
    tmp.replace(path)


@dataclass(frozen=True)
class Series:
    """One curve: ``(x, y)`` points in x order, drawn in ``color``."""

    label: str
    points: Sequence[tuple[float, float]]
    color: Color


@dataclass(frozen=True)
class PlotArea:
    """Where the data lands on the canvas, and the data ranges it shows."""

    left: int
    top: int
    right: int
    bottom: int
    x_range: tuple[float, float]
    y_range: tuple[float, float]

    def to_pixel(self, x: float, y: float) -> tuple[int, int]:
        """Canvas coordinates of the data point ``(x, y)``."""
        x0, x1 = self.x_range
        y0, y1 = self.y_range
        px = self.left + (x - x0) / (x1 - x0) * (self.right - self.left)
        py = self.bottom - (y - y0) / (y1 - y0) * (self.bottom - self.top)
        return round(px), round(py)


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """About ``target`` round tick values (1, 2 or 5 times a power of ten) covering ``[lo, hi]``."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    value = first
    while value <= hi + 1e-9 * step:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _tick_label(value: float) -> str:
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.2f}".rstrip("0").rstrip(".")


def layout(width: int, height: int, series: Sequence[Series], y_range: tuple[float, float] | None) -> PlotArea:
    """The plot area for ``series`` on a ``width`` x ``height`` canvas."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    x_lo, x_hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    if x_hi <= x_lo:
        x_hi = x_lo + 1.0
    if y_range is None:
        y_lo, y_hi = (min(ys), max(ys)) if ys else (0.0, 1.0)
        if y_hi <= y_lo:
            y_hi = y_lo + 1.0
    else:
        y_lo, y_hi = y_range
    # The legend sits above the plot area, one row per series.
    top = 12 + LEGEND_ROW_H * len(series)
    return PlotArea(left=56, top=top, right=width - 16, bottom=height - 40, x_range=(x_lo, x_hi), y_range=(y_lo, y_hi))


def plot_series(
    path: Path | str,
    series: Sequence[Series],
    *,
    x_label: str = "",
    y_range: tuple[float, float] | None = None,
    width: int = 640,
    height: int = 360,
) -> Canvas:
    """Draw ``series`` as line plots with axes, tick labels and a legend, and write a PNG.

    Args:
        path: the PNG file to write.
        series: the curves; points outside ``y_range`` are clamped to its edge.
        x_label: written under the x axis.
        y_range: fixed y limits (None: fit the data).
        width, height: canvas size in pixels.

    Returns:
        The canvas that was written.
    """
    canvas = Canvas(width, height)
    area = layout(width, height, series, y_range)
    # Grid and tick labels.
    for y in nice_ticks(*area.y_range):
        _, py = area.to_pixel(area.x_range[0], y)
        canvas.line(area.left, py, area.right, py, GREY)
        label = _tick_label(y)
        canvas.text(area.left - 6 - text_width(label) + 2, py - 5, label)
    for x in nice_ticks(*area.x_range, target=6):
        px, _ = area.to_pixel(x, area.y_range[0])
        canvas.line(px, area.bottom, px, area.bottom + 4, BLACK)
        label = _tick_label(x)
        canvas.text(px - text_width(label) // 2 + 1, area.bottom + 8, label)
    # Axes.
    canvas.line(area.left, area.top, area.left, area.bottom, BLACK)
    canvas.line(area.left, area.bottom, area.right, area.bottom, BLACK)
    if x_label:
        canvas.text((area.left + area.right - text_width(x_label)) // 2, height - 14, x_label)
    # Curves.
    y_lo, y_hi = area.y_range
    for s in series:
        pixels = [area.to_pixel(x, min(max(y, y_lo), y_hi)) for x, y in s.points]
        if len(pixels) == 1:
            canvas.rect(pixels[0][0] - 1, pixels[0][1] - 1, pixels[0][0] + 1, pixels[0][1] + 1, s.color)
        for (x0, y0), (x1, y1) in zip(pixels, pixels[1:]):
            canvas.line(x0, y0, x1, y1, s.color, width=2)
    # Legend, above the plot area.
    row_y = 6
    for s in series:
        canvas.rect(area.left, row_y + 3, area.left + 12, row_y + 5, s.color)
        canvas.text(area.left + 18, row_y, s.label)
        row_y += LEGEND_ROW_H
    write_png(path, canvas)
    return canvas
