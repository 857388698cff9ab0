"""CheckpointKeeper: a save and its record agree, and a cancel-save ends within ``cancel_save_timeout``."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from tests.pipeline_helpers import make_config, run_fake
from trio_rl import CheckpointLog
from trio_rl.testing import FakeBackend, FakeDataset, FakeLatencies

# Steps take 1.5 s (1 s sampling, 0.5 s training); save_state takes 5.5 s.


def slow_save_backend() -> FakeBackend:
    return FakeBackend(sample_latency=1.0, train_latency=0.5, latencies=FakeLatencies(save=0.0, state=5.5))


async def test_a_cancel_save_slower_than_cancel_save_timeout_is_given_up_unrecorded(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = slow_save_backend()
    config = make_config(log_path, "sync", save_on_cancel=True, cancel_save_timeout=1.0)
    start = trio.current_time()
    with trio.move_on_after(3.5):  # while step 2's groups sample, nothing submitted
        await run_fake(config, FakeDataset(100, 4), backend)
    assert trio.current_time() - start == pytest.approx(3.5 + 1.0)
    assert [c.detail["name"] for c in backend.calls_of("save_state")] == ["000002"]
    # The save did not complete, so no row claims it did.
    assert CheckpointLog(log_path).all() == []


async def test_a_periodic_save_cut_by_a_cancel_ends_within_cancel_save_timeout_and_is_not_restarted(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = slow_save_backend()
    config = make_config(log_path, "sync", save_every=1, save_on_cancel=True, cancel_save_timeout=1.0)
    start = trio.current_time()
    with trio.move_on_after(3.0):  # step 1's periodic save runs from 1.5 s to 7.0 s
        await run_fake(config, FakeDataset(100, 4), backend)
    assert trio.current_time() - start == pytest.approx(3.0 + 1.0)
    # Given up, it may still be writing: it is neither started again nor recorded.
    assert [c.detail["name"] for c in backend.calls_of("save_state")] == ["000001"]
    assert CheckpointLog(log_path).all() == []


async def test_a_cancel_save_within_cancel_save_timeout_is_recorded(log_path: Path, autojump_clock: MockClock) -> None:
    backend = slow_save_backend()
    config = make_config(log_path, "sync", save_on_cancel=True, cancel_save_timeout=10.0)
    start = trio.current_time()
    with trio.move_on_after(3.5):
        await run_fake(config, FakeDataset(100, 4), backend)
    assert trio.current_time() - start == pytest.approx(3.5 + 5.5)
    records = CheckpointLog(log_path).all()
    assert [(r.step, r.reason, r.final) for r in records] == [(2, "cancelled", True)]
