"""Sync mode, remove_constant_reward_groups, a batch whose every group has constant rewards.

tinker-cookbook 0.6.1's sync loop (``rl/train.py``, ``do_sync_training``, through
``rl/data_processing.py``'s ``remove_constant_reward_groups``) keeps the batch's first
group (``trajectory_groups_P[0:1]``), submits it and runs ``optim_step``.
"""

from __future__ import annotations

from pathlib import Path

from trio.testing import MockClock

from tests.pipeline_helpers import make_config, run_fake
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec


async def test_sync_batch_of_constant_groups_trains_its_first_group(log_path: Path, autojump_clock: MockClock) -> None:
    # Batch 0 is all constant-reward groups; batch 1 has none.
    spec = FakeEnvSpec(constant_reward_groups={(0, g) for g in range(4)})
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    config = make_config(log_path, "sync", remove_constant_reward_groups=True)
    result = await run_fake(config, FakeDataset(2, 4, spec), backend)
    assert result.final_step == 2
    forward = backend.calls_of("forward_backward")
    # Step 0 trained one group of 4 trajectories, step 1 all four groups.
    assert [c.detail["data"] for c in forward] == [4, 16]
    assert forward[0].detail["groups"] == [(0, 0)]
    assert len(backend.calls_of("optim_step")) == 2
    # The kept group is trained, not filtered; a new sampler is saved for each step.
    assert [r["data/groups_filtered_constant"] for r in result.step_metrics] == [3, 3]
    assert [r["progress/trained_groups"] for r in result.step_metrics] == [1, 5]
    assert len(backend.calls_of("save_weights_for_sampler")) == 1 + 2


async def test_sync_batch_with_one_varied_group_trains_only_that_group(
    log_path: Path, autojump_clock: MockClock
) -> None:
    spec = FakeEnvSpec(constant_reward_groups={(0, 0), (0, 1), (0, 3)})
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    config = make_config(log_path, "sync", remove_constant_reward_groups=True)
    await run_fake(config, FakeDataset(1, 4, spec), backend)
    assert [c.detail["groups"] for c in backend.calls_of("forward_backward")] == [[(0, 2)]]


async def test_sync_batch_of_constant_groups_is_trained_whole_without_the_filter(
    log_path: Path, autojump_clock: MockClock
) -> None:
    spec = FakeEnvSpec(constant_reward_groups={(0, g) for g in range(4)})
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    await run_fake(make_config(log_path, "sync"), FakeDataset(1, 4, spec), backend)
    assert [c.detail["data"] for c in backend.calls_of("forward_backward")] == [16]
