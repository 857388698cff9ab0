"""The step timeline page: one row per track, bars inside the window."""

from __future__ import annotations

import re
from pathlib import Path

from trio_rl.observe import SpanRecord, write_timeline


def test_the_timeline_has_a_row_per_track_and_a_bar_per_span(tmp_path: Path) -> None:
    spans = [
        SpanRecord("train_step", "trainer", 10.0, 14.0, {"step": 2}),
        SpanRecord("sample", "worker 2 rollout 0", 8.0, 11.0, {}),  # began before the window
        SpanRecord("sample", "worker 10 rollout 0", 11.0, 12.0, {}),
        SpanRecord("trajectory_group_worker", "worker 2", 12.0, 13.0, {}),
        SpanRecord("forward_backward", "trainer", 11.0, 12.0, {}),  # inside train_step
    ]
    path = tmp_path / "timing_gantt.html"
    write_timeline(path, 2, 10.0, 14.0, spans)
    text = path.read_text()
    labels = re.findall(r'<div class="label" title="([^"]+)"', text)
    assert labels == ["trainer", "worker 2", "worker 2 rollout 0", "worker 10 rollout 0"]
    lefts = [float(x) for x in re.findall(r"left:([0-9.]+)%", text)]
    widths = [float(x) for x in re.findall(r"width:([0-9.]+)%", text)]
    tops = [int(x) for x in re.findall(r"top:(\d+)px", text)]
    assert lefts == [0.0, 25.0, 50.0, 0.0, 25.0] and widths == [100.0, 25.0, 25.0, 25.0, 25.0]
    assert tops == [1, 4, 1, 1, 1]  # the nested span is drawn inside its parent
    assert "sample: 3000.000 ms" in text and "<script" not in text
