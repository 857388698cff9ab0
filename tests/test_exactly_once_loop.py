"""Issue 19's loop defects: exactly once at every stop and every resume, in virtual time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.conftest import TaskOrder, read_jsonl
from tests.pipeline_helpers import make_config, run_fake, straggling_group_1
from trio_rl import RetryOnFailure
from trio_rl.errors import NonFiniteError
from trio_rl.loop.checkpoints import CheckpointLog
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec, FakeEvaluator, FakeTrainingClient
from trio_rl.types import Env, Metrics, Trajectory


def _final_records(log_path: Path) -> list[dict[str, Any]]:
    return [r for r in read_jsonl(log_path / "metrics.jsonl") if "run/final_step" in r]


async def test_a_group_skipped_just_before_a_cancel_save_is_counted_after_the_resume(
    log_path: Path, autojump_clock: MockClock
) -> None:
    # Step 0 waits 10 s for its straggling group 1; step 1's group 0 fails at
    # about 11.5 s and is skipped; the cancel at 15 s comes before step 1's record.
    spec = FakeEnvSpec(fail_at={(1, 0): "compute_group_rewards"})
    config = make_config(log_path, "sync", save_on_cancel=True, rollout_error_tolerance=RetryOnFailure(max_retries=0))
    backend = FakeBackend(sample_latency=straggling_group_1, train_latency=0.5)
    with trio.move_on_after(15.0):
        await run_fake(config, FakeDataset(3, 2, spec), backend)
    saved = CheckpointLog(log_path).last()
    assert saved is not None and saved.reason == "cancelled" and saved.step == 1
    assert (1, 0) not in saved.outstanding  # retired from the ledger: only the count can remember it

    resumed = await run_fake(
        make_config(log_path, "sync", resume=True, **_tolerant()), FakeDataset(3, 2, spec), backend
    )
    assert resumed.summary["run/groups_skipped"] == 1
    assert resumed.summary["run/trained_groups"] + resumed.summary["run/groups_skipped"] == 6


def _tolerant() -> dict[str, Any]:
    return {"rollout_error_tolerance": RetryOnFailure(max_retries=0)}


async def test_resuming_a_finished_run_keeps_its_final_record(log_path: Path, autojump_clock: MockClock) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    first = await run_fake(make_config(log_path, "sync"), FakeDataset(3, 4), backend)
    again = await run_fake(make_config(log_path, "sync", resume=True), FakeDataset(3, 4), backend)
    assert again.summary == first.summary
    assert _final_records(log_path) == [first.summary]
    assert first.summary["run/trained_groups"] == 12


async def test_run_counts_and_trained_groups_continue_across_a_resume(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    await run_fake(make_config(log_path, "sync", max_steps=2), FakeDataset(4, 4), backend)
    resumed = await run_fake(make_config(log_path, "sync", resume=True), FakeDataset(4, 4), backend)
    assert [r["progress/trained_groups"] for r in resumed.step_metrics] == [12, 16]
    assert resumed.summary["run/trained_groups"] == resumed.trained_groups == 16


@pytest.mark.parametrize(("mode", "expected"), [("sync", 8), ("requeue", 8)])
async def test_in_flight_max_counts_the_groups_of_the_step_being_recorded(
    log_path: Path, mode: str, expected: int, autojump_clock: MockClock
) -> None:
    # Sync hands out batch s + 1 while step s trains: 8 groups are out at each
    # record; requeue at K=1 and 4 groups per step admits 8 at once.
    result = await run_fake(make_config(log_path, mode), FakeDataset(4, 4))
    assert max(r["rollouts/in_flight_max"] for r in result.step_metrics) == expected


@pytest.mark.parametrize("crash", ["nan", "env"])
async def test_a_crash_with_save_on_cancel_saves_nothing_and_writes_no_final_row(
    log_path: Path, crash: str, autojump_clock: MockClock
) -> None:
    spec = FakeEnvSpec(fail_at={} if crash == "nan" else {(1, 2): "step"})
    dataset = FakeDataset(3, 4, spec)
    if crash == "nan":
        original = dataset.get_batch

        def with_nan_reward(index: int) -> Any:
            batch = original(index)
            if index == 1:

                async def nan_rewards(
                    trajectory_group: list[Trajectory], env_group: Sequence[Env]
                ) -> list[tuple[float, Metrics]]:
                    return [(float("nan"), {}) for _ in trajectory_group]

                batch[2].compute_group_rewards = nan_rewards  # type: ignore[method-assign]
            return batch

        dataset.get_batch = with_nan_reward  # type: ignore[method-assign]
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    expected = NonFiniteError if crash == "nan" else RuntimeError
    with pytest.RaisesGroup(expected, flatten_subgroups=True):
        await run_fake(make_config(log_path, "sync", save_on_cancel=True), dataset, backend)
    assert CheckpointLog(log_path).all() == []
    assert backend.calls_of("save_state") == []


async def test_a_crashing_trainer_in_requeue_mode_raises_only_its_own_error(
    log_path: Path, autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    class BackendDownFake(Exception):
        pass

    async def failing_save_state(self: FakeTrainingClient, name: str) -> str:
        # At once: the dataloader, woken by the step's consumption, runs while the trainer unwinds.
        raise BackendDownFake("save_state failed")

    monkeypatch.setattr(FakeTrainingClient, "save_state", failing_save_state)
    config = make_config(log_path, "requeue", save_every=1)
    backend = FakeBackend(sample_latency=straggling_group_1, train_latency=0.5)
    with pytest.RaisesGroup(BackendDownFake, flatten_subgroups=True):
        await run_fake(config, FakeDataset(6, 4), backend)


async def test_evaluations_due_at_a_cancel_run_after_the_resume(log_path: Path, autojump_clock: MockClock) -> None:
    # Each evaluation takes 20 s, a step about 1.5 s: at the cancel, several due
    # evaluations are queued or running.
    evaluator = FakeEvaluator(latency=20.0)
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    config = make_config(log_path, "sync", eval_every=2, save_on_cancel=True)
    with trio.move_on_after(13.0):
        await run_fake(config, FakeDataset(10, 2), backend, (evaluator,))
    saved = CheckpointLog(log_path).last()
    assert saved is not None and saved.reason == "cancelled" and saved.step >= 6
    await run_fake(make_config(log_path, "sync", eval_every=2, resume=True), FakeDataset(10, 2), backend, (evaluator,))
    evaluated = sorted(r["step"] for r in read_jsonl(log_path / "metrics.jsonl") if "test/version" in r)
    assert evaluated == [0, 2, 4, 6, 8, 10]
    # Each one evaluated its own weights.
    assert all(r["test/version"] == r["step"] for r in read_jsonl(log_path / "metrics.jsonl") if "test/version" in r)


def run_with_scheduling_seed(
    task_order: TaskOrder, seed: int, mode: str, log_path: Path, **overrides: Any
) -> tuple[list[dict[str, Any]], str]:
    """One run with Trio's scheduler drawing from ``random.Random(seed)``: its records (less time/*) and checkpoint rows."""
    spec = FakeEnvSpec(fail_at={(b, g): "step" for b in range(5) for g in (0, 3)})
    config = make_config(log_path, mode, rollout_error_tolerance=RetryOnFailure(max_retries=1), **overrides)
    with task_order(seed):
        trio.run(
            run_fake,
            config,
            FakeDataset(5, 4, spec),
            FakeBackend(train_latency=1.0),
            clock=MockClock(autojump_threshold=0),
        )
    records = [
        {k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(log_path / "metrics.jsonl")
    ]
    return records, (log_path / "checkpoints.jsonl").read_text()


def test_skip_counts_in_step_records_do_not_depend_on_trio_task_order(
    tmp_path: Path, trio_task_order_from_seed: TaskOrder
) -> None:
    # Pace at K=1: step 1's groups fail at the same instant as step 0's.
    runs = [
        run_with_scheduling_seed(trio_task_order_from_seed, seed, "pace", tmp_path / str(seed))[0] for seed in range(6)
    ]
    assert all(records == runs[0] for records in runs)
    assert any(r.get("rollout_errors/groups_skipped") for r in runs[0])


@pytest.mark.parametrize("mode", ["sync", "requeue"])
def test_checkpoint_rows_do_not_depend_on_trio_task_order(
    tmp_path: Path, mode: str, trio_task_order_from_seed: TaskOrder
) -> None:
    rows = [
        run_with_scheduling_seed(trio_task_order_from_seed, seed, mode, tmp_path / str(seed), save_every=1)[1]
        for seed in range(6)
    ]
    assert all(r == rows[0] for r in rows)
    assert rows[0].count("\n") >= 4
