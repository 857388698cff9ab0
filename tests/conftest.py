"""Shared fixtures: fake datasets and backends, and a run-folder factory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a ``.jsonl`` file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "run"
