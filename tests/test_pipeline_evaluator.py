"""The evaluator runs on every due step and the final weights, once each, logged under its step."""

from __future__ import annotations

from pathlib import Path

import pytest
from trio.testing import MockClock

from tests.conftest import read_jsonl
from tests.pipeline_helpers import MODES, make_config, run_fake
from trio_rl.testing import FakeDataset, FakeEvaluator


@pytest.mark.parametrize("mode", MODES)
async def test_evaluates_due_steps_and_final_weights_once(log_path: Path, mode: str, autojump_clock: MockClock) -> None:
    evaluator = FakeEvaluator()
    result = await run_fake(make_config(log_path, mode, eval_every=3), FakeDataset(7, 4), evaluators=(evaluator,))
    final = result.final_step
    assert evaluator.versions == sorted(set(evaluator.versions))
    assert evaluator.versions == sorted({0, 3, 6, final} & set(range(final + 1)))


async def test_a_slow_evaluator_runs_late_but_never_skips(log_path: Path, autojump_clock: MockClock) -> None:
    # Evaluating takes 10 s, a step 1.5 s: the evaluator falls behind the trainer.
    evaluator = FakeEvaluator(latency=10.0)
    result = await run_fake(make_config(log_path, "sync", eval_every=1), FakeDataset(8, 4), evaluators=(evaluator,))
    assert evaluator.versions == list(range(result.final_step + 1)) == list(range(9))
    records = read_jsonl(log_path / "metrics.jsonl")
    # Each evaluation is logged in the line of the step whose weights it evaluated.
    assert [r["step"] for r in records] == list(range(9))
    assert all(r["test/version"] == r["step"] for r in records)


async def test_final_weights_evaluated_when_the_last_step_is_not_due(log_path: Path, autojump_clock: MockClock) -> None:
    evaluator = FakeEvaluator()
    await run_fake(make_config(log_path, "sync", eval_every=4), FakeDataset(5, 4), evaluators=(evaluator,))
    assert evaluator.versions == [0, 4, 5]
    final = read_jsonl(log_path / "metrics.jsonl")[-1]
    assert final["step"] == 5 and final["test/version"] == 5 and final["run/final_step"] == 5


async def test_eval_every_zero_evaluates_only_the_final_weights(log_path: Path, autojump_clock: MockClock) -> None:
    evaluator = FakeEvaluator()
    await run_fake(make_config(log_path, "pace", eval_every=0), FakeDataset(3, 4), evaluators=(evaluator,))
    assert evaluator.versions == [3]
