"""A crash anywhere cancels every stage at the same virtual instant and surfaces unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from tinker import types as tinker_types
from trio.testing import MockClock

from tests.pipeline_helpers import MODES, make_config, run_fake
from trio_rl import CheckpointLog
from trio_rl.errors import NonFiniteError
from trio_rl.testing import (
    FakeBackend,
    FakeDataset,
    FakeEnvGroupBuilder,
    FakeEnvSpec,
    FakeEvaluator,
    FakeSamplingClient,
)


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


async def test_one_backend_fault_under_many_waiters_is_raised_once(log_path: Path, autojump_clock: MockClock) -> None:
    # The sampler dies under every pending request at once, as a dead thread would.
    fault = ConnectionError("sampler thread died")

    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    original = FakeSamplingClient.sample

    async def sample(
        self: FakeSamplingClient,
        prompt: tinker_types.ModelInput,
        num_samples: int,
        sampling_params: tinker_types.SamplingParams,
    ) -> tinker_types.SampleResponse:
        if self.version >= 1:
            await trio.sleep(0.5)
            raise fault
        return await original(self, prompt, num_samples, sampling_params)

    FakeSamplingClient.sample = sample  # type: ignore[method-assign]
    try:
        with pytest.raises(ExceptionGroup) as caught:
            await run_fake(make_config(log_path, "pace"), FakeDataset(6, 4), backend)
    finally:
        FakeSamplingClient.sample = original  # type: ignore[method-assign]
    leaves = []
    stack: list[BaseException] = [caught.value]
    while stack:
        exc = stack.pop()
        if isinstance(exc, BaseExceptionGroup):
            stack.extend(exc.exceptions)
        else:
            leaves.append(exc)
    assert leaves == [fault]


class NanRewardBuilder(FakeEnvGroupBuilder):
    async def compute_group_rewards(self, trajectory_group, env_group):  # type: ignore[no-untyped-def]
        rewards = await super().compute_group_rewards(trajectory_group, env_group)
        return [(float("nan") if self.key == (1, 2) else r, m) for r, m in rewards]


async def test_a_non_finite_reward_stops_the_run_naming_the_group(log_path: Path, autojump_clock: MockClock) -> None:
    class Dataset(FakeDataset):
        def get_batch(self, index: int) -> list[FakeEnvGroupBuilder]:
            return [NanRewardBuilder((index, g), self.spec, self.log) for g in range(self.batch_sizes[index])]

    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    with pytest.RaisesGroup(pytest.RaisesExc(NonFiniteError, match="group 2 of dataset batch 1 .* nan"), flatten_subgroups=True):
        await run_fake(make_config(log_path, "sync"), Dataset(3, 4), backend)
    # Nothing was trained on it: only batch 0 reached forward_backward.
    assert {key[0] for call in backend.calls_of("forward_backward") for key in call.detail["groups"]} == {0}


async def test_a_group_with_no_envs_is_an_error_not_an_empty_run(log_path: Path, autojump_clock: MockClock) -> None:
    with pytest.RaisesGroup(pytest.RaisesExc(ValueError, match=r"make_envs\(\) returned no envs"), flatten_subgroups=True):
        await run_fake(make_config(log_path, "sync"), FakeDataset(2, 4, FakeEnvSpec(group_size=0)))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("where", ["worker", "dataloader"])
async def test_a_crash_is_never_taken_for_the_end_of_data(
    log_path: Path, mode: str, where: str, autojump_clock: MockClock
) -> None:
    # A crashing stage's channels close as it unwinds; the trainer must not see
    # that as the end of data and train a partial step or save a final state.
    class Dataset(FakeDataset):
        def get_batch(self, index: int) -> list[FakeEnvGroupBuilder]:
            if where == "dataloader" and index == 2:
                raise EnvBroke("the dataset could not build batch 2")
            return list(super().get_batch(index))  # type: ignore[arg-type]

    spec = FakeEnvSpec(fail_at={(2, 1): "compute_group_rewards"} if where == "worker" else {}, error=EnvBroke)
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    with pytest.RaisesGroup(EnvBroke, flatten_subgroups=True):
        await run_fake(make_config(log_path, mode), Dataset(3, 4, spec), backend)
    assert CheckpointLog(log_path).all() == []
    trained = [key for call in backend.calls_of("forward_backward") for key in call.detail["groups"]]
    assert all(key[0] < 2 for key in trained)
