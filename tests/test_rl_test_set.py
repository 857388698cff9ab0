"""RLTestSetEvaluator: the cookbook's test-set evaluation, with its ``test/...`` keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from tests.pipeline_helpers import make_config, run_fake
from trio_rl import RetryOnFailure, RLTestSetEvaluator
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec, FakeSamplingClient


async def test_it_rolls_out_every_group_and_reports_under_test() -> None:
    dataset = FakeDataset(2, 3, tags=lambda b, g: ("problems",))
    evaluator = RLTestSetEvaluator(dataset, max_tokens=4)
    with trio.fail_after(10):
        metrics = await evaluator(FakeSamplingClient(FakeBackend(), 0, None))
    assert metrics["test/env/all/total_episodes"] == 6 * 4
    assert "test/env/all/reward/total" in metrics
    # One tag covering every group repeats env/all: not written, as in the cookbook.
    assert not any(key.startswith("test/env/problems/") for key in metrics)
    again = await evaluator(FakeSamplingClient(FakeBackend(), 0, None))
    assert again == metrics  # seeded by the group's place: the same every time


async def test_a_failing_group_is_left_out_under_a_tolerant_strategy() -> None:
    dataset = FakeDataset(1, 3, FakeEnvSpec(fail_at={(0, 1): "step"}))
    client = FakeSamplingClient(FakeBackend(), 0, None)
    metrics = await RLTestSetEvaluator(dataset, 4, strategy=RetryOnFailure(max_retries=0))(client)
    assert metrics["test/env/all/total_episodes"] == 2 * 4
    with pytest.RaisesGroup(RuntimeError, flatten_subgroups=True):
        await RLTestSetEvaluator(dataset, 4)(client)


async def test_as_a_run_evaluator_its_keys_sit_beside_the_steps(log_path: Path, autojump_clock: MockClock) -> None:
    evaluator = RLTestSetEvaluator(FakeDataset(1, 2), max_tokens=4)
    result = await run_fake(make_config(log_path, "sync", eval_every=1), FakeDataset(2, 2), evaluators=(evaluator,))
    assert all("test/env/all/reward/total" in m and "time/run_evals" in m for m in result.metrics)
