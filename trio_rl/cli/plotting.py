"""The run's curves as a PNG, with matplotlib: the mean reward per step and the evaluation metrics.

Drawn with the Agg backend (no display needed) from the records of ``metrics.jsonl``;
the axes are fitted to the data, so a reward above 1 or below 0 stays in view.
"""

# matplotlib's stubs leave the **kwargs of its drawing methods untyped.
# pyright: reportUnknownMemberType=false

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from .progress import REWARD_KEY, STEP_KEY

CURVE_FILE = "reward_curve.png"
"""The picture's name in the run folder."""


def series(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The steps and finite values of ``key``.

    A step's record holds the metrics of training step ``step`` and the
    evaluation of the weights after ``step`` steps, so an ``eval/`` key is also
    read from the final-weights record, while a training metric is read only
    from training steps.
    """
    steps: list[int] = []
    values: list[float] = []
    for record in records:
        value = record.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if key.startswith("eval/") or STEP_KEY in record:
            steps.append(int(record["step"]))
            values.append(float(value))
    return steps, values


def draw_curves(records: Sequence[Mapping[str, Any]], eval_keys: Sequence[str] = ()) -> Figure | None:
    """The figure: mean reward against the step, and beside it each evaluation metric that has points.

    Returns:
        None when there is nothing to draw yet.
    """
    panels = [(REWARD_KEY, series(records, REWARD_KEY))]
    panels += [(key, series(records, key)) for key in eval_keys]
    panels = [(key, points) for key, points in panels if points[0]]
    if not panels:
        return None
    # A Figure made directly, not through pyplot: no global state, no GUI backend.
    figure = Figure(figsize=(5.0 * len(panels), 3.6), layout="constrained")
    for index, (key, (steps, values)) in enumerate(panels):
        axes = figure.add_subplot(1, len(panels), index + 1)
        axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, color=f"C{index}")
        axes.set_title(key)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
    return figure


def write_curves(log_path: Path, eval_keys: Sequence[str] = ()) -> Path | None:
    """Draw ``metrics.jsonl`` of ``log_path`` into ``reward_curve.png`` beside it.

    Returns:
        The PNG's path, or None when there is nothing to plot yet.
    """
    metrics = log_path / "metrics.jsonl"
    if not metrics.exists():
        return None
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    figure = draw_curves(records, eval_keys)
    if figure is None:
        return None
    out = log_path / CURVE_FILE
    figure.savefig(out, dpi=100)
    return out
