"""Async off-policy staleness: "requeue" resamples or drops, "pace" never lets it exceed K."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from trio.testing import MockClock

from tests.pipeline_helpers import make_config, run_fake, straggling_group_1
from trio_rl import AsyncConfig
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec


async def test_requeue_resamples_stale_groups_then_drops_and_counts_them(
    log_path: Path, autojump_clock: MockClock
) -> None:
    dataset = FakeDataset(num_batches=6, batch_size=4)
    config = make_config(
        log_path, "requeue", async_config=AsyncConfig(max_steps_off_policy=1, groups_per_batch=2, staleness="requeue")
    )
    result = await run_fake(config, dataset, FakeBackend(sample_latency=straggling_group_1, train_latency=0.5))
    summary = result.summary
    assert summary["run/requeued"] > 0
    # Resampled before the end of data: those groups had their envs built again.
    assert any(b.attempts > 1 for b in dataset._builders.values())
    assert summary["run/dropped_stale"] > 0
    # Every group was trained once or dropped once: nothing lost, nothing twice.
    assert summary["run/trained_groups"] + summary["run/dropped_stale"] == dataset.total_groups == 24
    assert summary["run/cancelled_groups"] == 0
    for record in result.step_metrics:
        assert record["async/staleness_max"] <= 1


async def test_requeue_with_a_small_worker_pool_never_deadlocks(log_path: Path, autojump_clock: MockClock) -> None:
    dataset = FakeDataset(num_batches=8, batch_size=4)
    config = make_config(
        log_path,
        "requeue",
        num_workers=1,
        async_config=AsyncConfig(max_steps_off_policy=0, groups_per_batch=3, staleness="requeue"),
    )
    result = await run_fake(config, dataset, FakeBackend(sample_latency=straggling_group_1, train_latency=2.0))
    assert result.summary["run/trained_groups"] + result.summary["run/dropped_stale"] == 32


@pytest.mark.parametrize("k", [0, 1, 3])
async def test_pace_bounds_staleness_and_groups_in_flight(log_path: Path, k: int, autojump_clock: MockClock) -> None:
    rng = random.Random(k)
    latencies: dict[tuple[int, ...], float] = {}

    def random_latency(request: Any) -> float:
        key = tuple(request[0].to_ints()[:3])
        return latencies.setdefault(key, rng.choice([0.5, 1.0, 4.0]))

    dataset = FakeDataset(num_batches=10, batch_size=3)
    groups_per_batch = 4
    config = make_config(
        log_path,
        "pace",
        async_config=AsyncConfig(max_steps_off_policy=k, groups_per_batch=groups_per_batch, staleness="pace"),
    )
    result = await run_fake(config, dataset, FakeBackend(sample_latency=random_latency, train_latency=1.0))
    assert result.trained_groups == 30 and result.dropped_groups == 0
    assert max(r["async/staleness_max"] for r in result.step_metrics) <= k
    assert max(r["rollouts/in_flight_max"] for r in result.step_metrics) <= groups_per_batch * (k + 1)
    if k > 0:
        # Off-policy for real: some step trained on weights older than its own.
        assert max(r["async/staleness_max"] for r in result.step_metrics) >= 1


def one_in_three_straggles(request: Any) -> float:
    """Groups 1, 4, 7, ... of every batch take 10,000 times longer than the rest."""
    group = request[0].to_ints()[1] - 2
    return 10_000.0 if group % 3 == 1 else 1.0


async def test_requeue_keeps_training_while_stragglers_are_out(log_path: Path, autojump_clock: MockClock) -> None:
    dataset = FakeDataset(num_batches=8, batch_size=6)
    config = make_config(
        log_path, "requeue", async_config=AsyncConfig(max_steps_off_policy=1, groups_per_batch=4, staleness="requeue")
    )
    backend = FakeBackend(sample_latency=one_in_three_straggles, train_latency=0.5)
    result = await run_fake(config, dataset, backend)
    step_times = [c.time for c in backend.calls_of("optim_step")]
    # 32 fast groups make 8 steps; none of them waited for a straggler.
    assert len([t for t in step_times if t < 100.0]) >= 7
    assert result.summary["run/trained_groups"] + result.summary["run/dropped_stale"] == 48
    assert max(r["async/staleness_max"] for r in result.step_metrics) <= 1


async def test_requeue_never_stops_for_rollouts_that_never_finish(log_path: Path, autojump_clock: MockClock) -> None:
    # Group 1 of batch 0 hangs on its first attempt, and no per-rollout timeout is set.
    dataset = FakeDataset(num_batches=6, batch_size=4, spec=FakeEnvSpec(hang_at={(0, 1)}))
    config = make_config(
        log_path, "requeue", async_config=AsyncConfig(max_steps_off_policy=1, groups_per_batch=4, staleness="requeue")
    )
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    result = await run_fake(config, dataset, backend)
    # The hung rollout was given up once stale, resampled and trained.
    assert dataset._builders[(0, 1)].attempts == 2
    assert (0, 1) in {key for call in backend.calls_of("forward_backward") for key in call.detail["groups"]}
    # A group that expires at the instant the data runs out is dropped (counted), not resampled.
    assert result.summary["run/trained_groups"] + result.summary["run/dropped_stale"] == 24
