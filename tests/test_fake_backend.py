"""The fakes of trio_rl.testing take any well-formed data, however short."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trio
from tinker import types as tinker_types
from trio.testing import MockClock

from tests.pipeline_helpers import make_config, run_fake
from trio_rl import _tinker_compat as compat
from trio_rl.testing import FakeBackend, FakeDataset
from trio_rl.types import ActionExtra, Env, EnvGroupBuilder, Metrics, Observation, StepResult, StopCondition, Trajectory


class OneTokenEnv(Env):
    """A one-token prompt, answered in one token: its Datum's model input has one token."""

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return compat.model_input_from_ints([7]), [0]

    async def step(self, action: list[int], *, extra: ActionExtra | None = None) -> StepResult:
        return StepResult(
            reward=float(len(action)),
            episode_done=True,
            next_observation=compat.model_input_from_ints([7, *action]),
            next_stop_condition=[0],
        )


class OneTokenGroup(EnvGroupBuilder):
    async def make_envs(self) -> Sequence[Env]:
        return [OneTokenEnv(), OneTokenEnv()]

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        return [(float(i), {}) for i in range(len(trajectory_group))]


class OneTokenDataset(FakeDataset):
    def get_batch(self, index: int) -> list[EnvGroupBuilder]:
        return [OneTokenGroup() for _ in range(self.batch_sizes[index])]


async def test_a_run_whose_data_has_one_token_model_inputs_trains_on_the_fake_backend(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    result = await run_fake(make_config(log_path, "sync", max_tokens=1), OneTokenDataset(2, 2), backend)
    assert result.final_step == 2
    calls = backend.calls_of("forward_backward")
    assert [c.detail["tokens"] for c in calls] == [4, 4]  # 2 groups x 2 envs x 1 token


async def test_forward_backward_and_compute_logprobs_take_inputs_of_one_token_and_none() -> None:
    backend = FakeBackend()
    async with backend:
        client = await backend.create_training_client(base_model="fake", lora_rank=1, seed=0)
        sampler = await backend.create_sampling_client(base_model="fake")
        for tokens in ([7], []):
            datum = tinker_types.Datum(
                model_input=compat.model_input_from_ints(tokens),
                loss_fn_inputs={
                    "target_tokens": compat.tensor([8] * len(tokens), "int64"),
                    "logprobs": compat.tensor([-1.0] * len(tokens), "float32"),
                    "advantages": compat.tensor([1.0] * len(tokens), "float32"),
                },
            )
            with trio.fail_after(10):
                result = await (await client.forward_backward([datum], "importance_sampling")).result()
                logprobs = await sampler.compute_logprobs(compat.model_input_from_ints(tokens))
            assert len(result.loss_fn_outputs[0]["logprobs"].tolist()) == len(tokens)
            assert len(logprobs) == len(tokens)
