"""FakeBackend's in-flight weights: each token's version is the newest published before it was produced."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import trio
import trio.testing
from tinker import types as tinker_types

from trio_rl import _tinker_compat as compat
from trio_rl.backends.protocol import VersionedSequence, check_inflight_before_work, token_versions
from trio_rl.testing import (
    FakeBackend,
    FakeLatencies,
    FakeSamplerModel,
    FakeSamplingClient,
    FakeSequence,
    FakeTrainingClient,
)

DEADLINE_S = 1_000.0
"""Virtual seconds after which a test counts as hung; under autojump this fails at once."""


def length_from_first_token(prompt: Sequence[int], sample_index: int) -> int:
    return prompt[0]


def modelled(slots: int | None = None, latencies: FakeLatencies | None = None) -> FakeBackend:
    """One token per virtual second, each response as long as its prompt's first token."""
    sampler = FakeSamplerModel(slots=slots, token_latency=1.0, response_length=length_from_first_token)
    return FakeBackend(sampler=sampler, latencies=latencies)


async def inflight_client(backend: FakeBackend) -> tuple[FakeTrainingClient, FakeSamplingClient]:
    """A training client of ``backend`` and an in-flight sampling client of its version 0."""
    training = await backend.create_training_client(base_model="fake")
    return training, await training.save_weights_for_sampler("000000", inflight=True)


async def sample(client: FakeSamplingClient, prompt: list[int], num_samples: int = 1) -> tinker_types.SampleResponse:
    params = tinker_types.SamplingParams(max_tokens=10_000, seed=prompt[-1])
    return await client.sample(compat.model_input_from_ints(prompt), num_samples, params)


async def publish_at(training: FakeTrainingClient, at: float, steps: int = 1) -> FakeSamplingClient:
    """At virtual time ``at``, take ``steps`` optimizer steps and publish the weights in flight."""
    await trio.sleep_until(at)
    for _ in range(steps):
        await training.optim_step(tinker_types.AdamParams(learning_rate=1e-3))
    return await training.save_weights_for_sampler(f"{training.version:06d}", inflight=True)


async def sample_across_a_publish(
    backend: FakeBackend, at: float, prompt: list[int], *, num_samples: int = 1, cancel_after: float = math.inf
) -> tuple[FakeSamplingClient, tinker_types.SampleResponse | None]:
    """Sample ``prompt`` from an in-flight client of ``backend``'s version 0 while version 1 is
    published at virtual time ``at``: the client, and the response (None if the request was
    cancelled, which it is after ``cancel_after`` s)."""
    training, client = await inflight_client(backend)
    response = None
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish_at, training, at)
            with trio.move_on_after(cancel_after):
                response = await sample(client, prompt, num_samples)
    return client, response


def expected_versions(backend: FakeBackend, sequence: FakeSequence, floor: int) -> list[int]:
    """Each token's version from the recorded in-flight saves: the newest one before the token's time."""
    saves = [(c.time, c.version) for c in backend.calls_of("save_weights_for_sampler") if c.detail["inflight"]]
    out = []
    for i in range(sequence.length):
        before = [v for t, v in saves if t < sequence.token_time(i)]
        out.append(max(floor, before[-1]) if before else floor)
    return out


async def test_a_sequence_spanning_a_publish_carries_both_versions(autojump_clock: trio.testing.MockClock) -> None:
    backend = modelled()
    client, response = await sample_across_a_publish(backend, 3.5, [10, 1])
    assert client.inflight and client.version == 0
    assert response is not None
    (sequence,) = backend.sequences
    # Tokens are produced at 1, 2, ..., 10 s; the weights of step 1 arrive at 3.5 s.
    assert sequence.token_versions == (0, 0, 0, 1, 1, 1, 1, 1, 1, 1)
    assert list(sequence.token_versions) == expected_versions(backend, sequence, floor=0)
    returned = response.sequences[0]
    assert isinstance(returned, VersionedSequence)
    assert token_versions(returned) == list(sequence.token_versions)
    assert len(returned.tokens) == 10


async def test_a_publish_at_the_instant_of_a_token_counts_from_the_next_token(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Token 2 is produced at exactly 3 s, when version 1 is published.
    backend = modelled()
    await sample_across_a_publish(backend, 3.0, [5, 1])
    assert backend.sequences[0].token_versions == (0, 0, 0, 1, 1)


async def test_several_publishes_during_one_sequence_each_take_over_in_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = modelled()
    training, client = await inflight_client(backend)

    async def publishes() -> None:
        for at in (1.5, 2.5, 6.25):
            await publish_at(training, at)

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publishes)
            await sample(client, [8, 1])
    sequence = backend.sequences[0]
    assert sequence.token_versions == (0, 1, 2, 2, 2, 2, 3, 3)
    assert list(sequence.token_versions) == expected_versions(backend, sequence, floor=0)


async def test_a_request_on_an_older_inflight_client_starts_on_the_newest_weights(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = modelled()
    training = await backend.create_training_client(base_model="fake")
    old = await training.save_weights_for_sampler("000000", inflight=True)
    await publish_at(training, 1.0, steps=2)
    await sample(old, [3, 1])
    assert backend.sequences[0].version == 0
    assert backend.sequences[0].token_versions == (2, 2, 2)


async def test_a_queued_sequence_takes_the_versions_of_when_its_tokens_are_produced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = modelled(slots=1)
    training, client = await inflight_client(backend)
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample, client, [4, 1])
            nursery.start_soon(sample, client, [2, 2])
            nursery.start_soon(publish_at, training, 1.5)
    first, second = backend.sequences
    # [2, 2] takes the only slot first (ties go by prompt); [4, 1], asked for at
    # 0 s on version 0, waits until 2 s and produces every token after the publish.
    assert (second.prompt, second.requested, second.started) == ((4, 1), 0.0, 2.0)
    assert first.token_versions == (0, 1) and second.token_versions == (1, 1, 1, 1)


async def test_a_snapshot_client_ignores_inflight_publishes_and_returns_plain_sequences(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = modelled()
    training = await backend.create_training_client(base_model="fake")
    snapshot = await training.save_weights_for_sampler("000000")
    assert not snapshot.inflight
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish_at, training, 2.5)
            response = await sample(snapshot, [5, 1])
    assert backend.sequences[0].token_versions is None
    assert not isinstance(response.sequences[0], VersionedSequence)
    assert token_versions(response.sequences[0]) is None


async def test_tokens_and_logprobs_stay_those_of_the_starting_version(autojump_clock: trio.testing.MockClock) -> None:
    flat, spanning = modelled(), modelled()
    responses = []
    for backend, publish in ((flat, False), (spanning, True)):
        training, client = await inflight_client(backend)
        async with trio.open_nursery() as nursery:
            if publish:
                nursery.start_soon(publish_at, training, 2.5)
            responses.append(await sample(client, [6, 1]))
    assert spanning.sequences[0].token_versions != flat.sequences[0].token_versions
    assert responses[0].sequences[0].tokens == responses[1].sequences[0].tokens
    assert responses[0].sequences[0].logprobs == responses[1].sequences[0].logprobs


async def test_a_slow_inflight_save_publishes_when_it_returns_and_a_cancelled_one_never(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = modelled(latencies=FakeLatencies(save=2.0))
    training, client = await inflight_client(backend)  # returns at 2 s
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            # Asked at 3 s, published at 5 s; the next, asked at 6 s, is cancelled at 7 s.
            nursery.start_soon(publish_at, training, 3.0)

            async def cancelled_publish() -> None:
                with trio.move_on_after(1.0):
                    await publish_at(training, 6.0)

            nursery.start_soon(cancelled_publish)
            await sample(client, [9, 1])
    sequence = backend.sequences[0]
    # Tokens at 3, 4, ..., 11 s: version 1 from 5 s on (strictly after), version 2 never.
    assert sequence.token_versions == (0, 0, 0, 1, 1, 1, 1, 1, 1)


async def test_without_the_sampler_model_every_token_has_the_version_when_it_was_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _, response = await sample_across_a_publish(FakeBackend(sample_latency=2.0), 1.0, [3, 1], num_samples=3)
    assert response is not None
    for sequence in response.sequences:
        assert token_versions(sequence) == [1] * len(sequence.tokens)


async def test_token_versions_match_the_publish_times_under_random_traffic(
    autojump_clock: trio.testing.MockClock,
) -> None:
    rng = random.Random(7)
    backend = FakeBackend(
        sampler=FakeSamplerModel(
            slots=3, token_latency=0.25, response_length=lambda prompt, i: 1 + (prompt[0] * 7 + i * 3) % 23
        )
    )
    training = await backend.create_training_client(base_model="fake")
    clients = [await training.save_weights_for_sampler("000000", inflight=True)]

    async def publisher() -> None:
        for at in sorted(rng.uniform(0, 20) for _ in range(12)):
            client = await publish_at(training, at)
            clients.append(client)

    async def requester(at: float, prompt: list[int]) -> None:
        await trio.sleep_until(at)
        await sample(clients[-1], prompt, num_samples=2)

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher)
            for n in range(20):
                nursery.start_soon(requester, rng.uniform(0, 20), [n + 1, n])
    assert len(backend.sequences) == 40
    spanning = 0
    for sequence in backend.sequences:
        assert sequence.token_versions is not None
        assert list(sequence.token_versions) == expected_versions(backend, sequence, floor=sequence.version)
        spanning += len(set(sequence.token_versions)) > 1
    assert spanning > 0


def test_the_fake_backend_offers_inflight_weights() -> None:
    check_inflight_before_work(FakeBackend())


async def test_a_cancelled_sequence_records_the_versions_of_the_tokens_it_produced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend = modelled()
    _, response = await sample_across_a_publish(backend, 2.5, [10, 1], cancel_after=4.5)
    assert response is None
    (sequence,) = backend.sequences
    # Cancelled at 4.5 s: tokens at 1, 2, 3 and 4 s were produced, the weights of step 1 from 2.5 s on.
    assert sequence.cancelled and sequence.token_versions == (0, 0, 1, 1)
