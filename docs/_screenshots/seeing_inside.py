"""Take the "Seeing inside a run" guide's screenshots: a guess_number run, its transcript and timeline pages in headless Chromium.

Run from the repository root (needs Debian's ``chromium``)::

    PYTHONPATH=$PWD python docs/_screenshots/seeing_inside.py

It trains examples/guess_number.py for 3 steps on LocalBackend (a small model,
from scratch) with transcripts, timelines and the trace on, then writes
docs/images/transcript.png and docs/images/timeline.png.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import guess_number  # noqa: E402

from tests.chromium import screenshot  # noqa: E402

FLAGS = ["--max-steps", "3", "--groups-per-batch", "4", "--group-size", "4", "--eval-every", "0", "--save-every", "0"]
OBSERVE = ["--transcripts-every", "1", "--transcript-groups", "2", "--timeline-every", "1", "--trace"]


def main() -> None:
    images = ROOT / "docs" / "images"
    with tempfile.TemporaryDirectory() as tmp:
        assert guess_number.main(["--log-path", tmp, *FLAGS, *OBSERVE], progress=False) == 0
        step = Path(tmp) / "iteration_000002"
        screenshot(step / "train_transcript.html", images / "transcript.png", width=1100, height=900)
        screenshot(step / "timing_gantt.html", images / "timeline.png", width=1300, height=700)


if __name__ == "__main__":
    main()
