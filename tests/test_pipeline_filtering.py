"""Constant-reward groups are filtered out; an empty (mini)batch after filtering is not an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from trio.testing import MockClock

from tests.pipeline_helpers import MODES, make_config, run_fake
from trio_rl import TrainResult
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec

SKIPPING_MODES = [mode for mode in MODES if mode != "sync"]
"""The modes that skip a batch whose groups are all filtered, as tinker-cookbook 0.6.1's stream and async loops
do; its sync loop trains the batch's first group (tests/test_sync_constant_reward_batch.py)."""


async def run_filtering(
    log_path: Path, mode: str, batches: int, constant_groups: set[tuple[int, int]]
) -> tuple[TrainResult, FakeBackend]:
    """A run of ``batches`` batches of 4 groups that removes constant-reward groups, those of
    ``constant_groups`` (``(batch, group)``) being so; its result and its backend."""
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    config = make_config(log_path, mode, remove_constant_reward_groups=True)
    spec = FakeEnvSpec(constant_reward_groups=constant_groups)
    return await run_fake(config, FakeDataset(batches, 4, spec), backend), backend


@pytest.mark.parametrize("mode", SKIPPING_MODES)
async def test_a_batch_left_empty_by_filtering_trains_nothing_and_goes_on(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    # Batch 0 is all constant-reward groups; batch 1 has none.
    result, backend = await run_filtering(log_path, mode, 2, {(0, g) for g in range(4)})
    if mode == "oldest_first":
        # As in tinker-cookbook 0.6.1, a group is filtered the moment it arrives and
        # never joins a step: the survivors fill the only step.
        assert result.final_step == 1 and result.summary["run/filtered_constant"] == 4
        assert [c.detail["groups"] for c in backend.calls_of("forward_backward")] == [[(1, g) for g in range(4)]]
        return
    assert result.final_step == 2
    filtered = [r["data/groups_filtered_constant"] for r in result.step_metrics]
    assert filtered[-1] == 4
    # One step had no data at all: no forward_backward and no optim_step for it,
    # since Adam's momentum would move the weights without a gradient.
    assert len(backend.calls_of("optim_step")) == 1
    assert all(c.detail["data"] > 0 for c in backend.calls_of("forward_backward"))
    assert result.step_metrics[0]["env/all/reward/total"] == 1.0


async def test_stream_minibatch_emptied_by_filtering(log_path: Path, autojump_clock: MockClock) -> None:
    # Within one step, the first two groups (one minibatch) are constant.
    result, backend = await run_filtering(log_path, "stream", 1, {(0, 0), (0, 1)})
    assert result.final_step == 1
    assert [c.detail["data"] for c in backend.calls_of("forward_backward")] == [2 * 4]
    assert len(backend.calls_of("optim_step")) == 1


@pytest.mark.parametrize("mode", SKIPPING_MODES)
async def test_filtered_groups_are_not_counted_as_trained_and_publish_nothing(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    # Batch 1 is all constant-reward groups; batches 0 and 2 have none.
    result, backend = await run_filtering(log_path, mode, 3, {(1, g) for g in range(4)})
    assert result.trained_groups == result.summary["run/trained_groups"] == 8
    assert result.summary["run/filtered_constant"] == 4
    trained_steps = [r for r in result.step_metrics if r["progress/trained_groups"] > 0]
    # One sampler for the initial weights, then one per step that trained
    # something; the step that trained nothing saved none.
    saved = [c.detail["name"] for c in backend.calls_of("save_weights_for_sampler")]
    assert len(saved) == 1 + len({r["progress/trained_groups"] for r in trained_steps})
    if mode == "oldest_first":
        # Filtered on arrival (tinker-cookbook 0.6.1), so no step is left without data.
        assert result.final_step == 2 and len(saved) == 1 + result.final_step
        return
    assert len(saved) < 1 + result.final_step
