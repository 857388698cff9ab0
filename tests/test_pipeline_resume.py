"""Resuming from the last checkpoint neither loses nor replays data."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from tests.conftest import read_jsonl
from tests.pipeline_helpers import MODES, make_config, run_fake
from trio_rl.loop.checkpoints import CheckpointLog
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec


@pytest.mark.parametrize("mode", MODES)
async def test_resume_continues_at_the_saved_step_with_outstanding_work_first(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    spec = FakeEnvSpec(step_latency=2.0)
    first = await run_fake(make_config(log_path, mode, max_steps=3), FakeDataset(6, 4, spec), backend)
    checkpoint = CheckpointLog(log_path).last()
    assert checkpoint is not None and checkpoint.step == 3 and checkpoint.final
    assert len(checkpoint.outstanding) == first.cancelled_groups

    dataset = FakeDataset(6, 4, spec)
    second = await run_fake(make_config(log_path, mode, resume=True), dataset, backend)
    assert [c.kind for c in backend.calls if c.kind == "load_state"] == ["load_state"]
    assert second.step_metrics[0]["step"] == 3
    # The counts continue across the resume: the second run's are the whole run's.
    assert second.trained_groups >= first.trained_groups
    assert second.trained_groups + second.dropped_groups == 24
    # The resumed run began with the groups the first one left in flight.
    made = [line for line in dataset.log if line.startswith("make_envs")]
    outstanding = [f"make_envs {tuple(key)}" for key in checkpoint.outstanding]
    assert made[: len(outstanding)] == outstanding
    steps = [r["step"] for r in read_jsonl(log_path / "metrics.jsonl")]
    assert steps == sorted(set(steps)) == list(range(second.final_step + 1))


async def test_max_steps_counts_the_steps_before_a_resume(log_path: Path, autojump_clock: MockClock) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    await run_fake(make_config(log_path, "sync", max_steps=2), FakeDataset(6, 4), backend)
    resumed = await run_fake(make_config(log_path, "sync", max_steps=5, resume=True), FakeDataset(6, 4), backend)
    assert [r["step"] for r in resumed.step_metrics] == [2, 3, 4]
    assert resumed.final_step == 5 and resumed.stopped_by_max_steps


async def test_the_last_checkpoint_is_marked_final_even_when_saved_periodically(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    result = await run_fake(make_config(log_path, "sync", save_every=2), FakeDataset(4, 4), backend)
    records = [(c.step, c.reason, c.final) for c in CheckpointLog(log_path).all()]
    assert records == [(2, "periodic", False), (4, "periodic", False), (4, "final", True)]
    # The final record points at the state saved at step 4; it was not saved twice.
    assert [c.detail["name"] for c in backend.calls_of("save_state")] == ["000002", "000004"]
    assert result.checkpoint is not None and result.checkpoint.final and result.checkpoint.step == 4


def _trained_keys(backend: FakeBackend) -> list[tuple[int, int]]:
    """Every group whose data went into a forward_backward call, by its fake prompt."""
    return [key for call in backend.calls_of("forward_backward") for key in call.detail["groups"]]


@pytest.mark.parametrize("mode", MODES)
async def test_a_cancel_during_a_training_step_saves_that_step_done(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    # Sampling takes 1 s and training 10 s: a cancel at 5 s falls inside step 0's
    # forward_backward, which was submitted and cannot be taken back.
    backend = FakeBackend(sample_latency=1.0, train_latency=10.0)
    with trio.move_on_after(5.0):
        await run_fake(make_config(log_path, mode, save_on_cancel=True), FakeDataset(4, 4), backend)
    checkpoint = CheckpointLog(log_path).last()
    assert checkpoint is not None and checkpoint.reason == "cancelled"
    # The saved state holds step 0's update, and the record says so.
    assert backend.states[checkpoint.state_path] == checkpoint.step == 1
    assert not any(key[0] == 0 for key in checkpoint.outstanding)

    resumed = await run_fake(make_config(log_path, mode, resume=True), FakeDataset(4, 4), backend)
    assert resumed.step_metrics[0]["step"] == 1
    trained = _trained_keys(backend)
    # Across the cancel and the resume, every group was trained exactly once
    # or ("requeue", after the data ran out) dropped and counted.
    assert len(trained) == len(set(trained))
    assert len(trained) + resumed.dropped_groups == 16
