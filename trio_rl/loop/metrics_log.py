"""The run's ``metrics.jsonl``: written record by record, mirrored on a live channel, and read back by step."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from ..sinks import JsonlSink
from ..types import Metrics


class MetricsLog:
    """Writes each record to ``metrics.jsonl`` the moment it is made, and mirrors it on a live channel.

    A training step's record is written when the step ends; an evaluation's
    record is written when the evaluation ends, as a line of its own under the
    step whose weights it evaluated. So a slow evaluation never holds back the
    training records, and every line says which weights it describes.

    Nothing is kept in memory: a long run's records live in the file. The live
    channel exists only for a run that has a reader (``nursery.start``), and holds
    at most ``live_buffer`` records a slow reader has not taken yet; records past
    that are not mirrored (they are still in the file).

    Args:
        path: the ``metrics.jsonl`` to append to.
        live_buffer: records the live channel may hold; 0 for no live channel.
    """

    def __init__(self, path: Path | None, *, live_buffer: int = 0) -> None:
        self._jsonl = JsonlSink(path) if path is not None else None
        self._live_send, self.live = trio.open_memory_channel[dict[str, Any]](live_buffer)
        self._mirror = live_buffer > 0
        self.last_final: dict[str, Any] | None = None
        """The newest end-of-run record written (the one with ``run/final_step``)."""

    def write(self, step: int, metrics: Metrics) -> None:
        """Write a record of ``metrics`` under ``step``."""
        record: dict[str, Any] = {"step": step, **metrics}
        if "run/final_step" in record:
            self.last_final = record
        if self._jsonl is not None:
            self._jsonl.write(record)
        if self._mirror:
            # A reader that fell behind (or left) misses the record; it is in the file.
            with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
                self._live_send.send_nowait(record)

    def close(self) -> None:
        """Close the file and end the live channel."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        self._live_send.close()


def merge_by_step(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One dict per step, merging a step's training, evaluation and end-of-run records, in step order."""
    merged: dict[int, dict[str, Any]] = {}
    for record in records:
        merged.setdefault(record["step"], {}).update(record)
    return [merged[step] for step in sorted(merged)]
