"""A crash anywhere cancels every stage at the same virtual instant and surfaces unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from tests.pipeline_helpers import MODES, make_config, run_fake
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvGroupBuilder, FakeEnvSpec, FakeEvaluator


class EnvBroke(Exception):
    pass


@pytest.mark.parametrize("where", ["make_envs", "step", "compute_group_rewards"])
@pytest.mark.parametrize("mode", MODES)
async def test_an_env_crash_cancels_everything_at_once(
    log_path: Path, mode: str, where: str, autojump_clock: MockClock
) -> None:
    # Group (1, 1) fails; every other env takes 50 s per step, so a run that
    # waited for anything after the crash would end far later than it.
    spec = FakeEnvSpec(step_latency=50.0, fail_at={(1, 1): where}, error=EnvBroke)
    dataset = FakeDataset(num_batches=4, batch_size=4, spec=spec)
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    with pytest.RaisesGroup(pytest.RaisesExc(EnvBroke, match=f"failed in {where}"), flatten_subgroups=True):
        await run_fake(make_config(log_path, mode, eval_every=1), dataset, backend, evaluators=(FakeEvaluator(latency=500.0),))
    (crash_time,) = spec.failure_times
    assert trio.current_time() == crash_time
    # Every group whose envs were made was cleaned up, even the cancelled ones.
    made = {line.split(" ", 1)[1] for line in dataset.log if line.startswith("make_envs")}
    cleaned = {line.split(" ", 1)[1] for line in dataset.log if line.startswith("cleanup")}
    assert made <= cleaned


async def test_a_training_failure_cancels_rollouts_and_surfaces(log_path: Path, autojump_clock: MockClock) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    backend.fail_train = ValueError("backend refused the batch")
    dataset = FakeDataset(num_batches=5, batch_size=4, spec=FakeEnvSpec(step_latency=0.0))
    start = trio.current_time()
    with pytest.RaisesGroup(pytest.RaisesExc(ValueError, match="backend refused"), flatten_subgroups=True):
        await run_fake(make_config(log_path, "pace"), dataset, backend)
    # Sampling 1.0, then the first forward_backward fails when its result arrives at 1.5.
    assert trio.current_time() - start == pytest.approx(1.5, abs=1e-3)


async def test_an_evaluator_failure_cancels_training(log_path: Path, autojump_clock: MockClock) -> None:
    evaluator = FakeEvaluator(latency=0.25, fail_on_call=1)
    dataset = FakeDataset(num_batches=50, batch_size=4)
    start = trio.current_time()
    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="fake evaluator failed"), flatten_subgroups=True):
        await run_fake(make_config(log_path, "sync", eval_every=1), dataset, evaluators=(evaluator,))
    assert evaluator.versions == [0]
    # Step 0 trains by 1.5 and the evaluation of version 1 fails at once: far from 50 steps.
    assert trio.current_time() - start == pytest.approx(1.5, abs=1e-3)


async def test_a_crash_before_work_starts_is_not_a_hang(log_path: Path, autojump_clock: MockClock) -> None:
    class NoBackend(FakeBackend):
        async def create_training_client(self, **kwargs: object) -> None:  # type: ignore[override]
            raise ConnectionError("no service here")

    with pytest.RaisesGroup(ConnectionError):
        await run_fake(make_config(log_path, "sync"), FakeDataset(2, 4), NoBackend())


async def test_a_crash_and_a_failing_cleanup_both_reach_the_caller(log_path: Path, autojump_clock: MockClock) -> None:
    from tests.test_rollouts import CleanupBroke, CleanupFailsBuilder

    class Dataset(FakeDataset):
        """Group (0, 1) crashes in step, and then its cleanup fails too."""

        def get_batch(self, index: int) -> list[FakeEnvGroupBuilder]:
            return [
                (CleanupFailsBuilder if (index, g) == (0, 1) else FakeEnvGroupBuilder)((index, g), self.spec, self.log)
                for g in range(self.batch_sizes[index])
            ]

    dataset = Dataset(2, 2, FakeEnvSpec(fail_at={(0, 1): "step"}, error=EnvBroke))
    with pytest.raises(ExceptionGroup) as caught:
        await run_fake(make_config(log_path, "sync"), dataset)
    crashes, rest = caught.value.split(EnvBroke)
    assert crashes is not None, "the rollout's own crash was hidden by its cleanup's"
    assert rest is not None and rest.split(CleanupBroke)[0] is not None
