"""The garbage-collector policy the command line applies before a run."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from trio_rl import tune_gc_for_training
from trio_rl.loop.gc_policy import THRESHOLDS


@pytest.fixture
def restored_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_gc")
def test_tuning_freezes_the_live_heap_and_collects_less_often() -> None:
    gc.unfreeze()
    tune_gc_for_training()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == THRESHOLDS
    assert THRESHOLDS[0] > 700  # rarer than CPython's default young collections
