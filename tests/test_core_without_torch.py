"""The core (pipeline, FakeBackend, TinkerBackend, command line) imports and trains with torch unimportable.

CI also runs ``tests/core_without_torch.py`` in a venv of its own where torch is not installed at all.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "core_without_torch.py"


def test_fake_and_tinker_runs_work_without_torch() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--block"], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("ok: ") for line in lines)
    assert "trio_rl[local]" in lines[1]
