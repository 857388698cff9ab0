"""ConsumptionGate on its own: counting consumed groups and waking whoever waits for a change."""

from __future__ import annotations

import trio
from trio.testing import MockClock

from trio_rl.loop.gate import ConsumptionGate

DEADLINE_S = 100.0
"""Virtual seconds; under autojump a waiter that is never woken fails at once."""


def test_consume_counts_and_ignores_nothing_to_count() -> None:
    gate = ConsumptionGate()
    assert gate.consumed == 0
    gate.consume()
    gate.consume(3)
    gate.consume(0)
    gate.consume(-2)
    assert gate.consumed == 4


async def test_a_waiter_wakes_at_the_next_consume_and_not_before(autojump_clock: MockClock) -> None:
    gate = ConsumptionGate()
    woke: list[tuple[float, int]] = []

    async def wait() -> None:
        await gate.wait_for_change()
        woke.append((trio.current_time(), gate.consumed))

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            nursery.start_soon(wait)
            await trio.sleep(1.0)
            gate.consume(0)  # no change: nobody wakes
            await trio.sleep(1.0)
            gate.consume(2)
    assert woke == [(2.0, 2), (2.0, 2)]


async def test_a_change_between_the_check_and_the_wait_is_not_missed(autojump_clock: MockClock) -> None:
    # The dataloader's pattern: check the count, then wait with no checkpoint
    # between; every later consume must wake it, one at a time, with a fresh event each.
    gate = ConsumptionGate()
    seen: list[int] = []

    async def wait_until_consumed(threshold: int) -> None:
        while gate.consumed < threshold:
            await gate.wait_for_change()
            seen.append(gate.consumed)

    async def consume_each_second() -> None:
        for _ in range(3):
            await trio.sleep(1.0)
            gate.consume()

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_until_consumed, 3)
            nursery.start_soon(consume_each_second)
    assert seen == [1, 2, 3]
    assert trio.current_time() == 3.0
