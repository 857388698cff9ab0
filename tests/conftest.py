"""Shared fixtures: fake datasets and backends, and a run-folder factory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a ``.jsonl`` file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_metrics_by_step(path: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` merged per step (training, evaluation and final records)."""
    merged: dict[int, dict[str, Any]] = {}
    for record in read_jsonl(path):
        merged.setdefault(record["step"], {}).update(record)
    return [merged[step] for step in sorted(merged)]


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "run"
