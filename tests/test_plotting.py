"""trio_rl.plotting: the PNG encoder, the rasteriser and the plot layout."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from trio_rl.plotting import BLACK, WHITE, Canvas, Series, encode_png, layout, nice_ticks, plot_series


def decode_png(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and RGB bytes of an 8-bit RGB, filter-0 PNG (what encode_png writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    idat = b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, kind
        chunks[kind] = body
        if kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert list(chunks)[0] == b"IHDR" and list(chunks)[-1] == b"IEND"
    width, height, depth, color_type, _, _, interlace = struct.unpack(">IIBBBBB", chunks[b"IHDR"])
    assert (depth, color_type, interlace) == (8, 2, 0)
    raw = zlib.decompress(idat)
    stride = 3 * width
    assert len(raw) == height * (stride + 1)
    rows = [raw[y * (stride + 1) : (y + 1) * (stride + 1)] for y in range(height)]
    assert all(row[0] == 0 for row in rows)
    return width, height, b"".join(row[1:] for row in rows)


def test_png_round_trips_every_pixel() -> None:
    canvas = Canvas(7, 3)
    canvas.set(0, 0, (1, 2, 3))
    canvas.set(6, 2, (250, 0, 9))
    canvas.set(99, 99, BLACK)  # outside: ignored
    width, height, pixels = decode_png(encode_png(canvas))
    assert (width, height) == (7, 3)
    assert pixels == bytes(canvas.pixels)
    assert pixels[:3] == bytes((1, 2, 3)) and pixels[-3:] == bytes((250, 0, 9))


def test_lines_cover_their_end_points_and_text_draws_something() -> None:
    canvas = Canvas(20, 20)
    canvas.line(2, 3, 15, 11, BLACK)
    assert canvas.get(2, 3) == BLACK and canvas.get(15, 11) == BLACK
    assert canvas.get(19, 0) == WHITE
    end = canvas.text(0, 0, "0", scale=1)
    assert end == 4 and canvas.get(0, 0) == BLACK and canvas.get(1, 1) == WHITE


def test_nice_ticks_are_round_and_cover_the_range() -> None:
    assert nice_ticks(0.0, 1.0) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0.0, 900.0, target=6) == [0.0, 200.0, 400.0, 600.0, 800.0]


def test_plot_puts_the_curve_where_its_points_map(tmp_path: Path) -> None:
    red = (214, 39, 40)
    series = [Series("reward", [(0.0, 0.0), (50.0, 0.5), (100.0, 1.0)], red)]
    path = tmp_path / "curve.png"
    plot_series(path, series, x_label="step", y_range=(0.0, 1.0), width=320, height=200)
    width, height, pixels = decode_png(path.read_bytes())
    assert (width, height) == (320, 200)

    def color(x: int, y: int) -> tuple[int, int, int]:
        i = 3 * (y * width + x)
        return (pixels[i], pixels[i + 1], pixels[i + 2])

    area = layout(320, 200, series, (0.0, 1.0))
    for x_data, y_data in [(0.0, 0.0), (25.0, 0.25), (50.0, 0.5), (100.0, 1.0)]:
        px, py = area.to_pixel(x_data, y_data)
        assert color(px, py) == red, (x_data, y_data)
    # Far from the line, inside the plot area: background or grid, never the curve.
    px, py = area.to_pixel(90.0, 0.1)
    assert color(px, py) != red
    # The axes are black.
    assert color(area.left, (area.top + area.bottom) // 2) == BLACK
    assert color((area.left + area.right) // 2, area.bottom) == BLACK
