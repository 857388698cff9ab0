"""The run's trace: Chrome/Perfetto trace-event JSON, written span by span.

The file is ``{"traceEvents": [...]}``: one ``"X"`` (complete) event per span,
with ``ts`` and ``dur`` in microseconds from the trace's start, and one ``"M"``
event naming each track's thread. ui.perfetto.dev opens it in the browser with
nothing uploaded; so does ``chrome://tracing``.

Events are written as spans close, so a long run's trace is not held in memory;
:meth:`TraceFile.close` ends the JSON, and the run closes the file on every
way out (a crash and a cancellation too), so the file is always whole.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, Any

from .spans import SpanRecord

PROCESS_ID = 1
"""Every track is a thread of one process: the run."""


class TraceFile:
    """Writes closed spans to a trace-event JSON file.

    Args:
        path: the file to write (replaced if it exists).
        origin: Trio's clock at the trace's start; timestamps count from it.
        run_name: the process's name in the viewer.
    """

    def __init__(self, path: Path, *, origin: float, run_name: str = "trio_rl run") -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._origin = origin
        self._tracks: dict[str, int] = {}
        self._file: IO[str] | None = path.open("w")
        self._file.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
        self._first = True
        self._event({"name": "process_name", "ph": "M", "pid": PROCESS_ID, "tid": 0, "args": {"name": run_name}})

    def write(self, record: SpanRecord) -> None:
        """Add one closed span (after :meth:`close`, nothing is written)."""
        if self._file is None:
            return
        tid = self._tracks.get(record.track)
        if tid is None:
            tid = self._tracks[record.track] = len(self._tracks) + 1
            self._event(
                {"name": "thread_name", "ph": "M", "pid": PROCESS_ID, "tid": tid, "args": {"name": record.track}}
            )
        self._event(
            {
                "name": record.name,
                "cat": record.name.split("/", 1)[0],
                "ph": "X",
                "ts": round((record.start - self._origin) * 1e6, 3),
                "dur": round((record.end - record.start) * 1e6, 3),
                "pid": PROCESS_ID,
                "tid": tid,
                "args": record.args,
            }
        )

    def _event(self, event: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(("" if self._first else ",\n") + json.dumps(event, default=str))
        self._first = False

    def close(self) -> None:
        """End the JSON and close the file (again: nothing happens)."""
        if self._file is None:
            return
        self._file.write("\n]}\n")
        self._file.close()
        self._file = None


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The events of a trace file written by :class:`TraceFile`.

    Raises:
        ValueError: the file is not a whole trace-event JSON object.
    """
    parsed = json.loads(path.read_text())
    if not isinstance(parsed, dict) or not isinstance(parsed.get("traceEvents"), list):
        raise ValueError(f"{path} is not a trace-event JSON object with a traceEvents list")
    return list(parsed["traceEvents"])
