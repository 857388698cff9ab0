"""Metrics that add up over several calls by the suffix of their name, as the Tinker service's do.

A backend's ``forward_backward`` metric named ``...:sum`` is a sum over its
data and ``...:max`` a maximum; a step of several calls adds the sums and keeps
the largest maximum, so derived values (means, fractions) are exact for the step.
"""

from __future__ import annotations

from collections.abc import Mapping


def add_reduced(total: dict[str, float], metrics: Mapping[str, float], prefix: str = "") -> None:
    """Add ``metrics`` whose names start with ``prefix`` into ``total``: ``:max`` keeps the larger, others add."""
    for key, value in metrics.items():
        if not key.startswith(prefix):
            continue
        total[key] = max(total.get(key, value), value) if key.endswith(":max") else total.get(key, 0.0) + value
