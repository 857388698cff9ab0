"""trio_rl.cli.plotting: the curves, fitted to the data, from metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.image import imread

from trio_rl.cli.plotting import CURVE_FILE, draw_curves, series, write_curves
from trio_rl.cli.progress import REWARD_KEY


def records() -> list[dict[str, object]]:
    steps: list[dict[str, object]] = [
        {
            "step": s,
            "progress/groups": 4,
            REWARD_KEY: 0.1 + 0.05 * s,
            **({"eval/win_rate": 0.1 * s} if s % 5 == 0 else {}),
        }
        for s in range(23)
    ]
    # The final-weights record: an evaluation at step 23, no training metrics.
    steps.append({"step": 23, "run/final_step": 23, "eval/win_rate": 2.5, REWARD_KEY: 99.0})
    return steps


def test_series_reads_eval_keys_from_every_record_and_training_keys_from_steps_only() -> None:
    assert series(records(), "eval/win_rate") == ([0, 5, 10, 15, 20, 23], [0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    steps, values = series(records(), REWARD_KEY)
    assert steps == list(range(23)) and max(values) < 1.3
    assert series([{"step": 0, "progress/groups": 1, REWARD_KEY: float("nan")}], REWARD_KEY) == ([], [])


def test_axes_fit_the_data_beyond_zero_to_one() -> None:
    # guess_number's rewards go above 1 (success plus format reward): nothing is cut off.
    figure = draw_curves(records(), ["eval/win_rate", "eval/absent"])
    assert figure is not None
    reward_axes, eval_axes = figure.axes  # an absent metric gets no panel
    assert reward_axes.get_title() == REWARD_KEY and eval_axes.get_title() == "eval/win_rate"
    low, high = reward_axes.get_ylim()
    assert low <= 0.1 and 1.2 <= high < 1.5
    assert reward_axes.get_xlim()[1] < 25
    assert eval_axes.get_ylim()[1] >= 2.5


def test_write_curves_writes_a_png_of_the_run(tmp_path: Path) -> None:
    assert write_curves(tmp_path) is None  # no metrics yet
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records()))
    path = write_curves(tmp_path, ["eval/win_rate"])
    assert path == tmp_path / CURVE_FILE
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = imread(path).shape
    assert width > height > 100  # two panels side by side
