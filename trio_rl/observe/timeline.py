"""A step's timeline: a self-contained HTML Gantt chart of the spans in its window.

tinker-cookbook 0.6.1 draws ``timing_gantt.html`` with plotly, when plotly is
installed. This page needs nothing: one row per track, one bar per span, a
colour per span name, each bar's name, duration and details in its tooltip. It
has no script, so it renders the same in any browser and offline.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from .files import write_atomically
from .spans import SpanRecord


def _colour(index: int) -> str:
    # Hues a golden angle apart: any number of span names, each distinguishable from its neighbours.
    return f"hsl({(index * 137.508) % 360:.1f}, 62%, {48 + 10 * (index % 2)}%)"


_STYLE = """
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 4px; }
.meta { color: #555; margin-bottom: 12px; }
.row { display: flex; align-items: center; height: 22px; border-bottom: 1px solid #eee; }
.label { width: 200px; flex: none; overflow: hidden; white-space: nowrap; text-overflow: ellipsis; padding-right: 8px; }
.lane { position: relative; flex: 1; height: 18px; background: #fafafa; }
.bar { position: absolute; min-width: 1px; border-radius: 2px; }
.axis { display: flex; justify-content: space-between; margin-left: 200px; color: #555; }
.legend span { display: inline-block; margin-right: 12px; }
.legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; vertical-align: middle; }
"""


def timeline_html(step: int, start: float, end: float, spans: Sequence[SpanRecord]) -> str:
    """The page for step ``step``'s window ``[start, end]`` (Trio's clock, seconds).

    Spans that began before the window are drawn from its left edge, and their
    tooltip gives their whole duration.
    """
    width = max(end - start, 1e-9)
    names = sorted({s.name for s in spans})
    colour = {name: _colour(i) for i, name in enumerate(names)}
    tracks: dict[str, list[SpanRecord]] = {}
    for record in sorted(spans, key=lambda s: (s.start, -s.end)):
        tracks.setdefault(record.track, []).append(record)
    rows = []
    for track in sorted(tracks, key=_track_order):
        bars = []
        open_ends: list[float] = []
        for s in tracks[track]:
            # Spans on a track nest: an inner one is drawn lower and thinner, inside its parent.
            while open_ends and open_ends[-1] <= s.start:
                open_ends.pop()
            depth = min(len(open_ends), 4)
            open_ends.append(s.end)
            left = max(s.start, start) - start
            right = min(s.end, end) - start
            tip = f"{s.name}: {(s.end - s.start) * 1e3:.3f} ms"
            if s.args:
                tip += " " + json.dumps(s.args, default=str)
            bars.append(
                f'<div class="bar" title="{html.escape(tip)}" style="left:{100 * left / width:.4f}%;'
                f"width:{100 * max(right - left, 0) / width:.4f}%;top:{1 + 3 * depth}px;height:{16 - 3 * depth}px;"
                f'background:{colour[s.name]}"></div>'
            )
        rows.append(
            f'<div class="row"><div class="label" title="{html.escape(track)}">{html.escape(track)}</div>'
            f'<div class="lane">{"".join(bars)}</div></div>'
        )
    legend = "".join(f'<span><i style="background:{colour[n]}"></i>{html.escape(n)}</span>' for n in names)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Step {step} timeline</title>'
        f"<style>{_STYLE}</style></head><body><h1>Step {step} timeline</h1>"
        f'<div class="meta">{len(spans)} spans on {len(tracks)} tracks over {width:.3f} s '
        "from the end of the step before; hover a bar for its span.</div>"
        f'<div class="legend">{legend}</div>'
        f'<div class="axis"><span>0 s</span><span>{width / 2:.3f} s</span><span>{width:.3f} s</span></div>'
        f"{''.join(rows)}</body></html>\n"
    )


def write_timeline(path: Path, step: int, start: float, end: float, spans: Sequence[SpanRecord]) -> None:
    """Write :func:`timeline_html` to ``path``, whole or not at all."""
    write_atomically(path, timeline_html(step, start, end, spans))


def _track_order(track: str) -> tuple[int, list[int], str]:
    # The trainer and the dataloader first, then each worker followed by its rollout lanes, in number order.
    first = {"trainer": 0, "dataloader": 1, "evaluator": 2}
    if track in first:
        return (first[track], [], track)
    numbers = [int(d) for d in "".join(c if c.isdigit() else " " for c in track).split()]
    return (3, numbers, track)
