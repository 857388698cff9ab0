"""Observations with image chunks: kept in the Datum as tinker-cookbook 0.6.1 keeps them; refused by the local backends.

The expected Datum below is the one 0.6.1's own ``rl/data_processing.py``
``trajectory_to_data`` builds from the same trajectory (``include_provenance=False``),
printed by running the 0.6.1 wheel's function.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
from tinker import types as tinker_types
from trio.testing import MockClock

from tests.pipeline_helpers import make_config, run_fake
from trio_rl import TokensWithLogprobs, Trajectory, Transition, trajectory_to_data
from trio_rl.backends.local.batch_inputs import parse_batch
from trio_rl.rl.kl import reference_logprob_diffs
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnv, FakeEnvGroupBuilder, FakeSamplingClient
from trio_rl.types import Env, Observation, StopCondition


def image(data: bytes = b"\x89PNG") -> tinker_types.ImageChunk:
    return tinker_types.ImageChunk(data=data, format="png", expected_tokens=4)


def text(*tokens: int) -> tinker_types.EncodedTextChunk:
    return tinker_types.EncodedTextChunk(tokens=list(tokens))


def two_turns_around_an_image() -> Trajectory:
    # The second observation extends the first (an equal image, not the same object).
    first = tinker_types.ModelInput(chunks=[text(1, 2), image(), text(3)])
    second = tinker_types.ModelInput(chunks=[text(1, 2), image(), text(3, 5, 6, 7)])
    return Trajectory(
        [
            Transition(first, TokensWithLogprobs([5, 6], [-0.5, -0.25]), 0.0, False),
            Transition(second, TokensWithLogprobs([8], [-0.125]), 1.0, True),
        ],
        second,
    )


def test_an_image_stays_whole_in_the_datum_as_in_tinker_cookbook_0_6_1() -> None:
    (datum,) = trajectory_to_data(two_turns_around_an_image(), 2.0)
    chunks = datum.model_input.chunks
    assert [c.type for c in chunks] == ["encoded_text", "image", "encoded_text"]
    assert chunks[0].tokens == [1, 2] and chunks[2].tokens == [3, 5, 6, 7]  # type: ignore[union-attr]
    assert chunks[1] == image()
    inputs = {key: value.tolist() for key, value in datum.loss_fn_inputs.items()}
    assert inputs["target_tokens"] == [2, 0, 0, 0, 0, 3, 5, 6, 7, 8]
    assert inputs["logprobs"] == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.5, -0.25, 0.0, -0.125]
    assert inputs["advantages"] == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 0.0, 2.0]
    assert inputs["mask"] == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0]


def test_a_different_image_starts_a_new_datum() -> None:
    first = tinker_types.ModelInput(chunks=[text(1), image(b"one")])
    second = tinker_types.ModelInput(chunks=[text(1), image(b"two"), text(5, 7)])
    trajectory = Trajectory(
        [
            Transition(first, TokensWithLogprobs([5], [-0.5]), 0.0, False),
            Transition(second, TokensWithLogprobs([8], [-0.25]), 1.0, True),
        ],
        second,
    )
    data = trajectory_to_data(trajectory, 1.0)
    assert [[c.type for c in d.model_input.chunks] for d in data] == [
        ["encoded_text", "image"],
        ["encoded_text", "image", "encoded_text"],
    ]
    assert data[0].model_input.chunks[1] == image(b"one") and data[1].model_input.chunks[1] == image(b"two")


def test_an_image_without_expected_tokens_is_refused_naming_the_cause() -> None:
    no_length = tinker_types.ImageChunk(data=b"\x89PNG", format="png")
    observation = tinker_types.ModelInput(chunks=[text(1, 2), no_length])
    trajectory = Trajectory([Transition(observation, TokensWithLogprobs([3], [-0.3]), 1.0, True)], observation)
    with pytest.raises(ValueError, match=r"turn 0: the observation's ImageChunk has no length .*expected_tokens"):
        trajectory_to_data(trajectory, 1.0)


def test_the_local_backends_refuse_an_image_datum_naming_it() -> None:
    (datum,) = trajectory_to_data(two_turns_around_an_image(), 2.0)
    with pytest.raises(
        ValueError, match=r"datum 0's model_input holds a ImageChunk \(type 'image'\); the local backends"
    ):
        parse_batch([datum], "importance_sampling", vocab_size=32, max_seq_len=64)


async def test_the_kl_reference_scores_an_image_datum_with_its_image() -> None:
    (datum,) = trajectory_to_data(two_turns_around_an_image(), 2.0)
    seen: list[tinker_types.ModelInput] = []

    class Reference(FakeSamplingClient):
        async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
            seen.append(prompt)
            return [None, *([-1.0] * (prompt.length - 1))]

    with trio.fail_after(10):
        (diff,) = await reference_logprob_diffs(Reference(FakeBackend(), 0, None), [datum])
    assert [c.type for c in seen[0].chunks][:2] == ["encoded_text", "image"] and seen[0].length == 11
    assert len(diff) == 10


class ImageEnv(FakeEnv):
    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return tinker_types.ModelInput(chunks=[text(*self.tokens), image()]), [0]


class ImageGroup(FakeEnvGroupBuilder):
    async def make_envs(self) -> Sequence[Env]:
        return [ImageEnv(self.key, i, self.spec, 0, self.log) for i in range(self.spec.group_size)]


class ImageDataset(FakeDataset):
    def get_batch(self, index: int) -> Sequence[FakeEnvGroupBuilder]:
        return [ImageGroup((index, g), self.spec, self.log) for g in range(self.batch_sizes[index])]


async def test_a_run_on_the_fake_service_trains_image_observations(log_path: Path, autojump_clock: MockClock) -> None:
    # FakeBackend stands for the Tinker service here: it takes image chunks, as Tinker does.
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    result = await run_fake(make_config(log_path, "sync"), ImageDataset(2, 2), backend)
    assert result.trained_groups == 4
    forward = backend.calls_of("forward_backward")
    assert [c.detail["groups"] for c in forward] == [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]


async def test_the_local_backend_refuses_to_sample_or_score_an_image_prompt(tmp_path: Path) -> None:
    from tests.local_helpers import SMALL_CONFIG, local_training_client
    from trio_rl.backends.local import CharTokenizer

    prompt = tinker_types.ModelInput(chunks=[text(1, 2), image()])
    opened = local_training_client(tmp_path, deadline_s=30, model_config=SMALL_CONFIG, tokenizer=CharTokenizer("ab"))
    async with opened as (_, client):
        sampler = await client.save_weights_for_sampler("s0")
        with pytest.raises(ValueError, match=r"the sample prompt holds a ImageChunk .*TinkerBackend"):
            await sampler.sample(prompt, 1, tinker_types.SamplingParams(max_tokens=2, seed=0))
        with pytest.raises(ValueError, match=r"the compute_logprobs prompt holds a ImageChunk"):
            await sampler.compute_logprobs(prompt)
