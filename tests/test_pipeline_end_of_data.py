"""The end of data, in every mode: it ends the run at once, with every group accounted for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.conftest import read_jsonl
from tests.pipeline_helpers import MODES, make_config, run_fake, straggling_group_1
from trio_rl import AsyncConfig, train
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec


@pytest.mark.parametrize("mode", ["pace", "requeue"])
async def test_fewer_groups_than_one_batch_train_one_partial_step(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    dataset = FakeDataset(num_batches=1, batch_size=4, last_batch_size=3)
    result = await run_fake(make_config(log_path, mode), dataset)
    assert result.final_step == 1
    assert result.trained_groups == 3
    record, final = read_jsonl(log_path / "metrics.jsonl")
    assert record["progress/partial_batch"] == 1 and record["progress/groups"] == 3
    assert final["step"] == 1 and final["run/trained_groups"] == 3
    assert result.checkpoint is not None and result.checkpoint.step == 1 and result.checkpoint.final


@pytest.mark.parametrize("mode", MODES)
async def test_exactly_one_batch_trains_one_full_step(log_path: Path, mode: str, autojump_clock: MockClock) -> None:
    result = await run_fake(make_config(log_path, mode), FakeDataset(num_batches=1, batch_size=4))
    assert (result.final_step, result.trained_groups) == (1, 4)
    assert result.step_metrics[0]["progress/partial_batch"] == 0


@pytest.mark.parametrize("mode", ["pace", "requeue"])
async def test_data_ending_mid_batch_trains_the_rest_as_a_last_partial_step(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    # 3 dataset batches of 3 groups = 9 groups, trained in steps of 4: 4, 4, then 1.
    dataset = FakeDataset(num_batches=3, batch_size=3)
    result = await run_fake(make_config(log_path, mode, num_workers=4), dataset, FakeBackend(sample_latency=1.0))
    assert [m["progress/groups"] for m in result.step_metrics] == [4, 4, 1]
    assert [m["progress/partial_batch"] for m in result.step_metrics] == [0, 0, 1]
    assert result.summary["run/trained_groups"] == 9 and result.summary["run/dropped_stale"] == 0
    assert result.checkpoint is not None and result.checkpoint.step == result.final_step == 3


async def test_requeue_accounts_for_every_group_when_data_ends(log_path: Path, autojump_clock: MockClock) -> None:
    dataset = FakeDataset(num_batches=3, batch_size=3)
    backend = FakeBackend(sample_latency=straggling_group_1, train_latency=0.5)
    config = make_config(log_path, "requeue", async_config=AsyncConfig(1, 2, "requeue"))
    result = await run_fake(config, dataset, backend)
    summary = result.summary
    assert summary["run/trained_groups"] + summary["run/dropped_stale"] == 9
    assert summary["run/dropped_stale"] == result.dropped_groups > 0
    assert summary["run/cancelled_groups"] == 0


@pytest.mark.parametrize("mode", ["sync", "stream"])
async def test_sync_data_ending_mid_batch_trains_the_short_last_batch(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    dataset = FakeDataset(num_batches=3, batch_size=4, last_batch_size=2)
    result = await run_fake(make_config(log_path, mode), dataset)
    assert [m["progress/groups"] for m in result.step_metrics] == [4, 4, 2]
    assert [m["progress/partial_batch"] for m in result.step_metrics] == [0, 0, 1]


@pytest.mark.parametrize("mode", MODES)
async def test_the_run_ends_the_instant_the_last_group_is_trained(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    dataset = FakeDataset(num_batches=1, batch_size=4)
    start = trio.current_time()
    await run_fake(make_config(log_path, mode), dataset, backend)
    forward_backwards = backend.calls_of("forward_backward")
    # Sampling takes 1.0, then each forward_backward 0.5; nothing waits after the last.
    assert forward_backwards[0].time - start == pytest.approx(1.0, abs=1e-6)
    assert trio.current_time() - start == pytest.approx(1.0 + 0.5 * len(forward_backwards), abs=1e-6)


@pytest.mark.parametrize("mode", MODES)
async def test_more_workers_than_groups(log_path: Path, mode: str, autojump_clock: MockClock) -> None:
    dataset = FakeDataset(num_batches=2, batch_size=4, last_batch_size=2)
    result = await run_fake(make_config(log_path, mode, num_workers=16), dataset)
    assert result.trained_groups + result.dropped_groups == 6
    assert len([line for line in dataset.log if line.startswith("cleanup")]) >= 6


@pytest.mark.parametrize("mode", MODES)
async def test_an_empty_dataset_trains_nothing_and_still_saves(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    result = await run_fake(make_config(log_path, mode), FakeDataset(num_batches=0, batch_size=4))
    assert result.final_step == 0 and result.step_metrics == []
    assert result.checkpoint is not None and result.checkpoint.step == 0


@pytest.mark.parametrize("mode", ["sync", "stream"])
async def test_sync_steps_follow_uneven_dataset_batches(log_path: Path, mode: str, autojump_clock: MockClock) -> None:
    result = await run_fake(make_config(log_path, mode), FakeDataset(batch_sizes=[4, 2, 6]))
    assert [m["progress/groups"] for m in result.step_metrics] == [4, 2, 6]
    assert result.summary["run/trained_groups"] == 12


@pytest.mark.parametrize("mode", MODES)
async def test_an_empty_batch_in_the_middle_is_skipped_and_counted(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    dataset = FakeDataset(batch_sizes=[4, 0, 4])
    result = await run_fake(make_config(log_path, mode), dataset)
    assert result.trained_groups == 8 and result.cancelled_groups == 0
    assert result.summary["run/empty_batches"] == 1
    assert sum(r["progress/groups"] for r in result.step_metrics) == 8


@pytest.mark.parametrize("mode", MODES)
async def test_each_dataset_batch_is_built_once(log_path: Path, mode: str, autojump_clock: MockClock) -> None:
    dataset = FakeDataset(batch_sizes=[4, 4, 3, 4])
    await run_fake(make_config(log_path, mode), dataset)
    assert dataset.batches_built == [0, 1, 2, 3]


def last_group_straggles(request: Any) -> float:
    """A sample latency: the last group of 2 batches of 4 (batch 1, group 3) takes 10,000 s, the others 1 s."""
    prompt = request[0].to_ints()
    return 10_000.0 if (prompt[0] - 1, prompt[1] - 2) == (1, 3) else 1.0


@pytest.mark.parametrize("k", [0, 1, 2])
async def test_requeue_gives_up_a_straggler_at_the_end_of_data_instead_of_waiting_for_it(
    log_path: Path, k: int, autojump_clock: MockClock
) -> None:
    config = make_config(log_path, "requeue", async_config=AsyncConfig(k, 4, "requeue"))
    backend = FakeBackend(sample_latency=last_group_straggles, train_latency=0.5)
    start = trio.current_time()
    result = await run_fake(config, FakeDataset(num_batches=2, batch_size=4), backend)
    # Steps take 1.5 s at most here; the final one waits K+1 of them, not 10,000 s.
    assert trio.current_time() - start < 10.0
    assert (result.summary["run/trained_groups"], result.summary["run/dropped_stale"]) == (7, 1)
    assert result.summary["run/cancelled_groups"] == 0
    assert [m["progress/groups"] for m in result.step_metrics] == [4, 3]
    assert (1, 3) not in {key for call in backend.calls_of("forward_backward") for key in call.detail["groups"]}


@pytest.mark.parametrize("k", [0, 1, 2])
async def test_requeue_never_hangs_on_a_rollout_that_never_returns_at_the_end_of_data(
    log_path: Path, k: int, autojump_clock: MockClock
) -> None:
    # No per_rollout_timeout: the last group's env never returns from its step.
    dataset = FakeDataset(num_batches=2, batch_size=4, spec=FakeEnvSpec(hang_at={(1, 3)}))
    config = make_config(log_path, "requeue", async_config=AsyncConfig(k, 4, "requeue"))
    with trio.fail_after(1_000):
        result = await run_fake(config, dataset)
    assert (result.summary["run/trained_groups"], result.summary["run/dropped_stale"]) == (7, 1)
    # The hung env was cleaned up like every other.
    assert len([line for line in dataset.log if line.startswith("cleanup")]) == 8


async def test_a_straggler_given_up_at_the_end_of_data_is_counted_once_across_a_cancel_and_resume(
    log_path: Path, autojump_clock: MockClock
) -> None:
    config = make_config(log_path, "requeue", async_config=AsyncConfig(1, 4, "requeue"), save_on_cancel=True)
    backend = FakeBackend(sample_latency=last_group_straggles, train_latency=0.5)
    start = trio.current_time()
    uninterrupted = await run_fake(
        replace(config, log_path=log_path.parent / "whole"), FakeDataset(num_batches=2, batch_size=4), backend
    )
    duration = trio.current_time() - start
    # Cancelled while the final step trains, after the straggler was given up.
    backend = FakeBackend(sample_latency=last_group_straggles, train_latency=0.5)
    async with backend:
        with trio.move_on_after(duration - 0.25):
            await train(config, dataset=FakeDataset(num_batches=2, batch_size=4), backend=backend)
        cancelled = read_jsonl(log_path / "checkpoints.jsonl")[-1]
        assert cancelled["reason"] == "cancelled"
        assert cancelled["counts"]["dropped_stale"] == 1
        resumed = await train(
            replace(config, resume=True), dataset=FakeDataset(num_batches=2, batch_size=4), backend=backend
        )
    trained = [key for call in backend.calls_of("forward_backward") for key in call.detail["groups"]]
    assert len(trained) == len(set(trained)) == 7
    assert resumed.summary["run/dropped_stale"] == uninterrupted.summary["run/dropped_stale"] == 1
    assert resumed.summary["run/trained_groups"] == uninterrupted.summary["run/trained_groups"] == 7
    assert resumed.summary["run/cancelled_groups"] == 0
    final, whole = (
        read_jsonl(log_path / "checkpoints.jsonl")[-1],
        read_jsonl(log_path.parent / "whole" / "checkpoints.jsonl")[-1],
    )
    counted = ("trained_groups", "dropped_stale", "requeued", "groups_skipped", "filtered_groups")
    assert [final["counts"][c] for c in counted] == [whole["counts"][c] for c in counted]
    assert (final["step"], final["final"]) == (whole["step"], True)
