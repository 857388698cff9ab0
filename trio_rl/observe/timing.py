"""Per-scope ``time/*`` metrics of a step, named as tinker-cookbook 0.6.1 names them.

0.6.1's ``IterationWindow.aggregate`` (``utils/trace.py``) turns a span seen
once in an iteration into ``time/{name}``, and one seen several times into
``time/{name}:total``, ``:count``, ``:mean`` and ``:max``. The spans here carry
the cookbook's scope names where it has the same scope (``train_step``,
``sample``, ``forward_backward``, ``optim_step``, ``save_checkpoint``,
``run_evals``...), so the keys match.
"""

from __future__ import annotations

from collections.abc import Iterable

from .spans import SpanRecord


def timing_metrics(spans: Iterable[SpanRecord]) -> dict[str, float]:
    """The ``time/*`` metrics of ``spans`` (seconds), by the cookbook's rule."""
    durations: dict[str, list[float]] = {}
    for record in spans:
        durations.setdefault(record.name, []).append(record.end - record.start)
    metrics: dict[str, float] = {}
    for name, values in durations.items():
        if len(values) == 1:
            metrics[f"time/{name}"] = values[0]
        else:
            metrics[f"time/{name}:total"] = sum(values)
            metrics[f"time/{name}:count"] = len(values)
            metrics[f"time/{name}:mean"] = sum(values) / len(values)
            metrics[f"time/{name}:max"] = max(values)
    return metrics


class StepWindow:
    """The spans that closed since the last step ended: one step's window, for its metrics and timeline."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.spans: list[SpanRecord] = []

    def add(self, record: SpanRecord) -> None:
        """Keep ``record`` for the current window."""
        self.spans.append(record)

    def take(self, end: float) -> tuple[float, list[SpanRecord]]:
        """The window's start and spans; the next window starts at ``end``."""
        start, spans = self.start, self.spans
        self.start, self.spans = end, []
        return start, spans
