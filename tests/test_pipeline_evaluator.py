"""The evaluator runs on every due step and the final weights, once each, logged under its step."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from tests.conftest import read_jsonl, read_metrics_by_step
from tests.pipeline_helpers import MODES, make_config, run_fake
from trio_rl import EvaluationTimeoutError
from trio_rl.testing import FakeBackend, FakeDataset, FakeEvaluator


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
    records = read_metrics_by_step(log_path / "metrics.jsonl")
    # Each evaluation is logged under the step whose weights it evaluated.
    assert [r["step"] for r in records] == list(range(9))
    assert all(r["test/version"] == r["step"] for r in records)


async def test_final_weights_evaluated_when_the_last_step_is_not_due(log_path: Path, autojump_clock: MockClock) -> None:
    evaluator = FakeEvaluator()
    await run_fake(make_config(log_path, "sync", eval_every=4), FakeDataset(5, 4), evaluators=(evaluator,))
    assert evaluator.versions == [0, 4, 5]
    final = read_metrics_by_step(log_path / "metrics.jsonl")[-1]
    assert final["step"] == 5 and final["test/version"] == 5 and final["run/final_step"] == 5


async def test_eval_every_zero_evaluates_only_the_final_weights(log_path: Path, autojump_clock: MockClock) -> None:
    evaluator = FakeEvaluator()
    await run_fake(make_config(log_path, "pace", eval_every=0), FakeDataset(3, 4), evaluators=(evaluator,))
    assert evaluator.versions == [3]


async def test_training_records_are_written_while_a_slow_evaluation_runs(
    log_path: Path, autojump_clock: MockClock
) -> None:
    # The first evaluation (of the initial weights) takes far longer than the
    # whole run's training; training records must not wait behind it.
    evaluator = FakeEvaluator(latency=1000.0)
    config = make_config(log_path, "sync", eval_every=0)
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    seen_at: dict[int, float] = {}

    async def watch(handle_metrics: trio.MemoryReceiveChannel[dict[str, float]]) -> None:
        async for record in handle_metrics:
            if "progress/groups" in record:
                seen_at[int(record["step"])] = trio.current_time()

    from trio_rl import train

    start = trio.current_time()
    with trio.fail_after(10_000):
        async with backend, trio.open_nursery() as nursery:
            handle = await nursery.start(
                lambda task_status: train(
                    config, dataset=FakeDataset(4, 4), backend=backend, evaluators=(evaluator,), task_status=task_status
                )
            )
            nursery.start_soon(watch, handle.metrics)
    assert sorted(seen_at) == [0, 1, 2, 3]
    # Every training record was live long before the final evaluation ended.
    assert max(seen_at.values()) - start < 100
    lines = read_jsonl(log_path / "metrics.jsonl")
    assert [r["step"] for r in lines if "progress/groups" in r] == [0, 1, 2, 3]
    assert [r["step"] for r in lines if "test/version" in r] == [4]


class HangingEvaluator:
    async def __call__(self, sampling_client: object) -> dict[str, float]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


async def test_a_hung_evaluator_ends_the_run_with_an_error_naming_it(log_path: Path, autojump_clock: MockClock) -> None:
    config = make_config(log_path, "sync", eval_every=2, eval_timeout=300.0)
    start = trio.current_time()
    with pytest.RaisesGroup(pytest.RaisesExc(EvaluationTimeoutError, match=r"HangingEvaluator on the weights of step 0 did not finish within 300 s")):
        await run_fake(config, FakeDataset(4, 4), evaluators=(HangingEvaluator(),))
    assert trio.current_time() - start == pytest.approx(300.0, abs=1.0)
    # Training went on while the evaluator hung: its records are on disk.
    lines = read_jsonl(log_path / "metrics.jsonl")
    assert [r["step"] for r in lines if "progress/groups" in r] == [0, 1, 2, 3]
