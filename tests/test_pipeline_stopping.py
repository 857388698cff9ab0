"""Stopping: max_steps, a host cancelling the run, and embedding with nursery.start."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from tests.conftest import read_jsonl
from tests.pipeline_helpers import MODES, RUN_DEADLINE_S, make_config, run_fake
from trio_rl import RunHandle, train
from trio_rl.loop.checkpoints import CheckpointLog
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvGroupBuilder, FakeEnvSpec, FakeEvaluator, FakeLatencies


@pytest.mark.parametrize("mode", MODES)
async def test_max_steps_cancels_rollouts_in_flight(log_path: Path, mode: str, autojump_clock: MockClock) -> None:
    # Envs take 10 s per step, so when step 2 is trained other groups are mid-rollout.
    dataset = FakeDataset(num_batches=20, batch_size=4, spec=FakeEnvSpec(step_latency=10.0))
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    start = trio.current_time()
    result = await run_fake(make_config(log_path, mode, max_steps=2), dataset, backend)
    assert result.final_step == 2 and result.stopped_by_max_steps
    last_training = max(c.time for c in backend.calls if c.kind in ("optim_step", "save_weights_for_sampler"))
    # Nothing waited for the rollouts still running: the run ended right after
    # the last step's weights (plus the final checkpoint, which takes no time here).
    assert trio.current_time() == pytest.approx(last_training, abs=1e-6)
    made = [line for line in dataset.log if line.startswith("make_envs")]
    cleaned = [line for line in dataset.log if line.startswith("cleanup")]
    assert len(made) > result.trained_groups  # some groups were in flight...
    assert len(cleaned) == len(made)  # ...and were cancelled and cleaned up
    assert result.summary["run/cancelled_groups"] == result.cancelled_groups > 0
    assert trio.current_time() - start < 10.0 * 3 + 1.0 + 0.5 * 3


@pytest.mark.parametrize("mode", ["sync", "pace"])
async def test_max_steps_zero_trains_nothing(log_path: Path, mode: str, autojump_clock: MockClock) -> None:
    result = await run_fake(make_config(log_path, mode, max_steps=0), FakeDataset(5, 4))
    assert result.final_step == 0 and result.step_metrics == []


async def test_nursery_start_hands_back_a_handle_with_live_metrics(log_path: Path, autojump_clock: MockClock) -> None:
    dataset = FakeDataset(num_batches=100, batch_size=4)
    seen: list[int] = []
    with trio.fail_after(RUN_DEADLINE_S):
        async with FakeBackend(sample_latency=1.0, train_latency=0.5) as backend, trio.open_nursery() as nursery:
            handle: RunHandle = await nursery.start(
                lambda task_status: train(
                    make_config(log_path, "pace"), dataset=dataset, backend=backend, task_status=task_status
                )
            )
            assert handle.step == 0 and handle.log_path == log_path
            async for record in handle.metrics:
                seen.append(record["step"])
                if record["step"] == 3:
                    assert handle.step >= 4
                    nursery.cancel_scope.cancel()
                    break
    assert seen == [0, 1, 2, 3]
    assert [r["step"] for r in read_jsonl(log_path / "metrics.jsonl")] == [0, 1, 2, 3]


async def test_cancelling_the_host_scope_stops_promptly(log_path: Path, autojump_clock: MockClock) -> None:
    dataset = FakeDataset(num_batches=100, batch_size=4, spec=FakeEnvSpec(step_latency=30.0))
    start = trio.current_time()
    with trio.move_on_after(40.0):
        await run_fake(make_config(log_path, "requeue"), dataset)
    assert trio.current_time() - start == pytest.approx(40.0)


async def test_save_on_cancel_writes_the_last_completed_step(log_path: Path, autojump_clock: MockClock) -> None:
    dataset = FakeDataset(num_batches=100, batch_size=4)
    with trio.move_on_after(4.0):
        await run_fake(make_config(log_path, "sync", save_on_cancel=True), dataset)
    checkpoint = CheckpointLog(log_path).last()
    assert checkpoint is not None and checkpoint.reason == "cancelled"
    # Steps take 1.5 s: by 4.0 two were complete.
    assert checkpoint.step == 2


class SlowCleanupBuilder(FakeEnvGroupBuilder):
    """Batches from 4 on, still in flight when max_steps=4 ends the run, take 20 s to clean up."""

    async def cleanup(self) -> None:
        if self.key[0] >= 4:
            await trio.sleep(20.0)
        await super().cleanup()


class SlowCleanupDataset(FakeDataset):
    def get_batch(self, index: int) -> list[FakeEnvGroupBuilder]:
        return [SlowCleanupBuilder((index, g), self.spec, self.log) for g in range(self.batch_sizes[index])]


@pytest.mark.parametrize("during", ["rollout teardown", "final evaluation", "final save"])
async def test_a_cancel_after_the_last_step_still_saves_it_once(
    log_path: Path, during: str, autojump_clock: MockClock
) -> None:
    # The last step ends at 6.0 s (4 steps of 1 s sampling + 0.5 s training); the
    # phase after it is made slow, and the cancel at 10 s lands inside it.
    backend = FakeBackend(
        sample_latency=1.0, train_latency=0.5, latencies=FakeLatencies(state=20.0 if during == "final save" else 0.0)
    )
    dataset = SlowCleanupDataset(8, 4) if during == "rollout teardown" else FakeDataset(8, 4)
    evaluators = (FakeEvaluator(latency=100.0),) if during == "final evaluation" else ()
    config = make_config(log_path, "sync", max_steps=4, save_on_cancel=True)
    with trio.move_on_after(10.0):
        await run_fake(config, dataset, backend, evaluators)
    records = CheckpointLog(log_path).all()
    assert records and records[-1].final and records[-1].step == 4
    # Saved once, even when the cancel came in the middle of that save.
    assert [c.detail["name"] for c in backend.calls_of("save_state")] == ["000004"]
