"""Rollout workers are started for the work in flight, whatever the staleness limit."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest
import trio
import trio.abc
import trio.lowlevel
from trio.testing import MockClock

from tests.pipeline_helpers import RUN_DEADLINE_S, make_config
from trio_rl import AsyncConfig, train
from trio_rl.testing import FakeBackend, FakeDataset


class CountSpawns(trio.abc.Instrument):
    """Counts the tasks spawned whose name contains ``name_part``."""

    def __init__(self, name_part: str) -> None:
        self.name_part = name_part
        self.spawned = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += self.name_part in task.name


@pytest.mark.parametrize("staleness", ["requeue", "pace"])
@pytest.mark.parametrize("k", [0, 2500, 100_000])
async def test_workers_are_bounded_by_the_work_not_by_k(
    log_path: Path, staleness: Literal["requeue", "pace"], k: int, autojump_clock: MockClock
) -> None:
    config = make_config(
        log_path, staleness, async_config=AsyncConfig(max_steps_off_policy=k, groups_per_batch=4, staleness=staleness)
    )
    workers = CountSpawns("rollout_worker")
    trio.lowlevel.add_instrument(workers)
    try:
        with trio.fail_after(RUN_DEADLINE_S):
            async with FakeBackend(sample_latency=1.0, train_latency=0.5) as backend:
                result = await train(config, dataset=FakeDataset(8, 4), backend=backend)
    finally:
        trio.lowlevel.remove_instrument(workers)
    assert result.trained_groups + result.dropped_groups == 32
    # Never more workers than groups that may be in flight: B * (K + 1), and the 32 there are.
    assert 1 <= workers.spawned <= min(4 * (k + 1), 32)
