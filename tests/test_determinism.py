"""Seeds derived from identities, and settle() under both kinds of clock."""

from __future__ import annotations

import trio
import trio.testing

from trio_rl.base.determinism import SETTLE_S, derive_seed, settle


def test_derived_seeds_fit_a_non_negative_int32() -> None:
    seeds = [derive_seed(seed, batch, group) for seed in range(3) for batch in range(50) for group in range(50)]
    assert all(0 <= s < 2**31 for s in seeds)
    assert len(set(seeds)) == len(seeds)


def test_derived_seeds_depend_only_on_their_parts() -> None:
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert derive_seed(1, 2, 3) != derive_seed(1, 3, 2)
    assert derive_seed("run", 1) != derive_seed("run", 2)


async def test_settle_under_the_real_clock_is_one_checkpoint() -> None:
    # In real time no order is promised (Trio may run a batch in either
    # direction); what remains is a prompt checkpoint that honours cancellation.
    start = trio.current_time()
    with trio.CancelScope() as scope:
        scope.cancel()
        await settle()
    assert scope.cancelled_caught
    await settle()
    assert trio.current_time() - start < 1.0


async def test_settle_under_a_mock_clock_waits_until_every_task_is_blocked(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A task that needs several scheduler passes still finishes first: the clock
    # only jumps past the settle once nothing can run.
    order: list[str] = []

    async def busy() -> None:
        for _ in range(50):
            await trio.lowlevel.checkpoint()
        order.append("busy")

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(busy)
        await settle()
        order.append("settled")
    assert order == ["busy", "settled"]
    assert trio.current_time() - start == SETTLE_S
