"""FakeBackend's finite sampler model: slots, per-token time, FIFO queueing, recorded sequences."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from tinker import types as tinker_types

from tests.conftest import TaskOrder
from tests.pipeline_helpers import make_config, run_fake
from trio_rl import _tinker_compat as compat
from trio_rl.base.determinism import derive_seed
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec, FakeSamplerModel, FakeSamplingClient, FakeSequence

DEADLINE_S = 1_000.0
"""Virtual seconds after which a test counts as hung; under autojump this fails at once."""


def length_from_first_token(prompt: Sequence[int], sample_index: int) -> int:
    """The length each test prompt asks for: its first token (plus the sample index)."""
    return prompt[0] + sample_index


async def sampler(backend: FakeBackend) -> FakeSamplingClient:
    return await backend.create_sampling_client(base_model="fake")


async def first_token_sampler(*, slots: int, token_latency: float) -> tuple[FakeBackend, FakeSamplingClient]:
    """A backend whose prompts ask for lengths by :func:`length_from_first_token`, and a sampling client of it."""
    backend = FakeBackend(
        sampler=FakeSamplerModel(slots=slots, token_latency=token_latency, response_length=length_from_first_token)
    )
    return backend, await sampler(backend)


async def sample_at(
    client: FakeSamplingClient,
    at: float,
    prompt: list[int],
    done: dict[tuple[int, ...], float],
    *,
    num_samples: int = 1,
    max_tokens: int = 1_000,
    passes: int = 0,
) -> tinker_types.SampleResponse:
    """Send one request at virtual time ``at``, ``passes`` scheduler passes later; note when it returned."""
    await trio.sleep_until(at)
    for _ in range(passes):
        await trio.lowlevel.checkpoint()
    params = tinker_types.SamplingParams(max_tokens=max_tokens, seed=prompt[-1])
    response = await client.sample(compat.model_input_from_ints(prompt), num_samples, params)
    done[tuple(prompt)] = trio.current_time()
    return response


async def sample_all(
    client: FakeSamplingClient,
    requests: Sequence[tuple[float, list[int]]],
    passes: Mapping[tuple[int, ...], int] | None = None,
) -> dict[tuple[int, ...], float]:
    """Send every ``(at, prompt)`` request by :func:`sample_at`, each in a task of its own, started in
    this order (``passes[prompt]`` scheduler passes late); when each returned."""
    done: dict[tuple[int, ...], float] = {}
    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            for at, prompt in requests:
                late = (passes or {}).get(tuple(prompt), 0)
                nursery.start_soon(partial(sample_at, passes=late), client, at, prompt, done)
    return done


def by_prompt(sequences: list[FakeSequence]) -> dict[tuple[int, ...], FakeSequence]:
    return {(*s.prompt, s.sample_index): s for s in sequences}


async def test_a_full_sampler_queues_until_a_slot_frees(autojump_clock: trio.testing.MockClock) -> None:
    backend, client = await first_token_sampler(slots=2, token_latency=1.0)
    done = await sample_all(client, [(0.0, [3, 1]), (0.0, [3, 2]), (0.0, [3, 3]), (0.0, [4, 4])])
    # Two run at once; the next two wait for them, 3 tokens x 1 s each.
    assert done == {(3, 1): 3.0, (3, 2): 3.0, (3, 3): 6.0, (4, 4): 7.0}
    queued = [s for s in backend.sequences if s.started > s.requested]
    assert [(s.prompt, s.started, s.ended) for s in queued] == [((3, 3), 3.0, 6.0), ((4, 4), 3.0, 7.0)]


async def test_waiting_sequences_start_in_arrival_order(autojump_clock: trio.testing.MockClock) -> None:
    backend, client = await first_token_sampler(slots=1, token_latency=1.0)
    arrivals = [(0.0, [10, 0]), (3.0, [1, 1]), (1.0, [2, 2]), (2.0, [1, 3]), (2.0, [1, 4])]
    # (1, 3) reaches the sampler two scheduler passes after (1, 4), at the same instant.
    done = await sample_all(client, arrivals, passes={(1, 3): 2})
    starts = [(s.prompt, s.requested, s.started) for s in backend.sequences]
    # Arrival order, and within one instant the order of the prompts, whichever pass they came in.
    assert starts == [
        ((10, 0), 0.0, 0.0),
        ((2, 2), 1.0, 10.0),
        ((1, 3), 2.0, 12.0),
        ((1, 4), 2.0, 13.0),
        ((1, 1), 3.0, 14.0),
    ]
    assert done[(1, 1)] == 15.0


async def test_a_free_slot_goes_to_the_first_prompt_of_its_instant_not_the_first_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend, client = await first_token_sampler(slots=1, token_latency=1.0)
    # (5, 1) reaches the free slot's sampler two scheduler passes before (4, 2).
    done = await sample_all(client, [(1.0, [5, 1]), (1.0, [4, 2])], passes={(4, 2): 2})
    assert [(s.prompt, s.started) for s in backend.sequences] == [((4, 2), 1.0), ((5, 1), 5.0)]
    assert done == {(4, 2): 5.0, (5, 1): 10.0}


async def test_every_sequence_is_recorded_with_its_length_and_token_times(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend, client = await first_token_sampler(slots=4, token_latency=0.5)
    done: dict[tuple[int, ...], float] = {}
    with trio.fail_after(DEADLINE_S):
        response = await sample_at(client, 1.0, [5, 9], done, num_samples=3, max_tokens=6)
    # Lengths 5, 6 and 7, the last capped at max_tokens (stopped by length).
    assert [len(s.tokens) for s in response.sequences] == [5, 6, 6]
    assert [s.stop_reason for s in response.sequences] == ["stop", "length", "length"]
    recorded = by_prompt(backend.sequences)
    assert [recorded[(5, 9, i)].length for i in range(3)] == [5, 6, 6]
    assert [recorded[(5, 9, i)].ended for i in range(3)] == [3.5, 4.0, 4.0]
    assert done[(5, 9)] == 4.0
    first = recorded[(5, 9, 0)]
    assert [first.token_time(i) for i in range(first.length)] == [1.5, 2.0, 2.5, 3.0, 3.5]
    assert first.token_time(first.length - 1) == first.ended
    with pytest.raises(IndexError):
        first.token_time(first.length)


async def test_a_zero_length_sequence_waits_its_turn_and_holds_no_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend, client = await first_token_sampler(slots=1, token_latency=1.0)
    done = await sample_all(client, [(0.0, [2, 1]), (0.5, [0, 2]), (0.5, [1, 3])])
    recorded = by_prompt(backend.sequences)
    empty, one = recorded[(0, 2, 0)], recorded[(1, 3, 0)]
    assert (empty.length, empty.started, empty.ended) == (0, 2.0, 2.0)
    assert (one.length, one.started, one.ended) == (1, 2.0, 3.0)
    assert one.token_time(0) == 3.0
    assert done == {(2, 1): 2.0, (0, 2): 2.0, (1, 3): 3.0}


async def test_a_cancelled_sequence_frees_its_slot_and_a_cancelled_waiter_takes_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backend, client = await first_token_sampler(slots=1, token_latency=1.0)
    done: dict[tuple[int, ...], float] = {}

    async def cancelled_at(at: float, prompt: list[int]) -> None:
        with trio.move_on_after(at):
            await sample_at(client, 0.0, prompt, done)

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancelled_at, 4.0, [10, 1])  # running, cancelled at 4
            nursery.start_soon(cancelled_at, 2.0, [10, 2])  # waiting, cancelled at 2
            nursery.start_soon(sample_at, client, 1.0, [3, 3], done)
    recorded = by_prompt(backend.sequences)
    running = recorded[(10, 1, 0)]
    assert (running.cancelled, running.ended) == (True, 4.0)
    assert (10, 2, 0) not in recorded  # it never got a slot
    assert (recorded[(3, 3, 0)].started, done[(3, 3)]) == (4.0, 7.0)
    assert done.keys() == {(3, 3)}


def busy_slots_never_exceed_and_nobody_waits_beside_a_free_slot(sequences: list[FakeSequence], slots: int) -> None:
    events = sorted({t for s in sequences for t in (s.requested, s.started, s.ended)})

    def busy(t: float) -> int:
        return sum(1 for s in sequences if s.started <= t < s.ended)

    assert max(busy(t) for t in events) <= slots
    for s in sequences:
        if s.started > s.requested:
            assert all(busy(t) == slots for t in events if s.requested <= t < s.started), s


def run_with_scheduling_seed(
    task_order: TaskOrder, seed: int
) -> tuple[list[FakeSequence], dict[tuple[int, ...], float]]:
    """Many requests of one instant competing for 3 slots, with Trio's scheduler seeded by ``seed``."""
    lengths = random.Random(0)

    def length(prompt: Sequence[int], sample_index: int) -> int:
        return derive_seed("length", *prompt, sample_index) % 7

    backend = FakeBackend(sampler=FakeSamplerModel(slots=3, token_latency=0.25, response_length=length))
    done: dict[tuple[int, ...], float] = {}

    async def main() -> None:
        client = await sampler(backend)
        with trio.fail_after(DEADLINE_S):
            async with trio.open_nursery() as nursery:
                for i in range(24):
                    at = float(lengths.choice([0, 0, 0.5, 1]))
                    nursery.start_soon(partial(sample_at, passes=i % 3), client, at, [i % 5, i], done)

    with task_order(seed):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return backend.sequences, done


def test_slot_order_does_not_depend_on_trio_scheduling_order(trio_task_order_from_seed: TaskOrder) -> None:
    first, first_done = run_with_scheduling_seed(trio_task_order_from_seed, 0)
    assert sum(1 for s in first if s.started > s.requested) >= 10  # the queue was really used
    busy_slots_never_exceed_and_nobody_waits_beside_a_free_slot(first, 3)
    for seed in range(1, 6):
        sequences, done = run_with_scheduling_seed(trio_task_order_from_seed, seed)
        assert sequences == first
        assert done == first_done


async def test_training_on_the_sampler_model_records_every_rollout(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    backend = FakeBackend(
        train_latency=0.1,
        sampler=FakeSamplerModel(slots=5, token_latency=0.01, response_length=length_from_first_token),
    )
    dataset = FakeDataset(6, 4, FakeEnvSpec(group_size=3))
    config = make_config(tmp_path, "pace", max_tokens=64)
    result = await run_fake(config, dataset, backend)
    assert result.trained_groups == 24
    sequences = backend.sequences
    # One sequence per rollout; a fake env's prompt starts [1 + batch, 2 + group, 3 + index].
    assert len(sequences) == 24 * 3
    assert all(s.length == s.prompt[0] for s in sequences)
    assert sum(1 for s in sequences if s.started > s.requested) > 0
    busy_slots_never_exceed_and_nobody_waits_beside_a_free_slot(sequences, 5)


async def test_without_the_model_sampling_is_unchanged(autojump_clock: trio.testing.MockClock) -> None:
    backend = FakeBackend(sample_latency=2.0)
    client = await sampler(backend)
    params = tinker_types.SamplingParams(max_tokens=12, seed=41)
    response = await client.sample(compat.model_input_from_ints([1, 2, 3]), 2, params)
    assert trio.current_time() == 2.0
    assert backend.sequences == []
    # The default path's draw: a length in 1..max_tokens, then the tokens, from one seeded generator.
    for i, sequence in enumerate(response.sequences):
        rng = random.Random(derive_seed(backend.seed, 41, i, 0))
        n = rng.randint(1, 12)
        assert list(sequence.tokens) == rng.choices(range(backend.sampler.vocab_size), k=n)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"slots": 0}, "slots must be at least 1"), ({"token_latency": -1.0}, "token_latency")],
)
def test_invalid_sampler_models_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FakeSamplerModel(**kwargs)


async def test_a_negative_response_length_names_the_sample(autojump_clock: trio.testing.MockClock) -> None:
    backend = FakeBackend(sampler=FakeSamplerModel(response_length=lambda prompt, index: -1))
    client = await sampler(backend)
    with pytest.raises(ValueError, match="response_length returned -1 for sample 0"):
        await client.sample(compat.model_input_from_ints([1]), 1, tinker_types.SamplingParams(max_tokens=4))
