"""A garbage-collector policy for a process whose main work is a training run.

CPython's cyclic collector rescans every live object that survived earlier
collections once enough new ones have survived too. A run's live heap is large
(torch, tinker and pydantic's import-time objects, the model, and every group
in flight), and with the default thresholds those scans took a large share of
the pipeline's CPU per group in ``bench/scaling.py`` (the benchmarks page has
the numbers). Reference counting frees almost
everything the pipeline allocates; the cyclic collector only has to find the
rare cycles (an exception's traceback, for one), and it can do that less often.
"""

from __future__ import annotations

import gc

THRESHOLDS = (20_000, 20, 20)
"""Allocations before a young collection, and young collections before each older one
(CPython's defaults are (700, 10, 10))."""


def tune_gc_for_training() -> None:
    """Freeze what is alive now out of the collector's scans, and collect less often.

    Call it once, after imports and model loading and before the run: the
    command line does. It changes process-wide state, so a program that embeds
    :func:`trio_rl.train` decides for itself (``gc.unfreeze()`` and
    ``gc.set_threshold(700, 10, 10)`` undo it).
    """
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
