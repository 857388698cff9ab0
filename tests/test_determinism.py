"""Seeds derived from identities, and settle(), the same wait under either clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from trio_rl.base.determinism import TRAINER_FIRST, derive_seed, settle


def test_derived_seeds_fit_a_non_negative_int32() -> None:
    seeds = [derive_seed(seed, batch, group) for seed in range(3) for batch in range(50) for group in range(50)]
    assert all(0 <= s < 2**31 for s in seeds)
    assert len(set(seeds)) == len(seeds)


def test_derived_seeds_depend_only_on_their_parts() -> None:
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3)
    assert derive_seed(1, 2, 3) != derive_seed(1, 3, 2)
    assert derive_seed("run", 1) != derive_seed("run", 2)


@pytest.fixture(params=["real clock", "mock clock"])
def either_clock(request: pytest.FixtureRequest) -> trio.testing.MockClock | None:
    """Runs the test under Trio's real clock, then under an autojumping MockClock (pytest-trio runs a test under a clock fixture's value)."""
    return trio.testing.MockClock(autojump_threshold=0) if request.param == "mock clock" else None


async def test_settle_honours_cancellation() -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await settle()
    assert scope.cancelled_caught


async def test_settle_waits_until_every_task_is_blocked_under_either_clock(
    either_clock: trio.testing.MockClock | None,
) -> None:
    # A task that needs many scheduler passes still finishes first, on the real
    # clock as on the mock one: the wait is the same under both.
    order: list[str] = []

    async def busy() -> None:
        for _ in range(50):
            await trio.lowlevel.checkpoint()
        order.append("busy")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy)
            await settle()
            order.append("settled")
    assert order == ["busy", "settled"]


async def test_settle_takes_no_virtual_time(autojump_clock: trio.testing.MockClock) -> None:
    # What is decided after a settle happens at the instant it was due, so
    # a tie between two events at one instant stays a tie.
    start = trio.current_time()
    for priority in (1, TRAINER_FIRST, 1):
        await settle(priority)
    assert trio.current_time() == start


async def test_the_trainer_goes_on_alone_and_the_others_after_what_it_did(
    either_clock: trio.testing.MockClock | None,
) -> None:
    events: list[str] = []

    async def rollout(name: str) -> None:
        await settle()
        events.append(f"{name} saw {'weights' if 'published' in events else 'nothing'}")

    async def trainer() -> None:
        await settle(TRAINER_FIRST)
        events.append("trainer on")
        for _ in range(20):  # work over several scheduler passes
            await trio.lowlevel.checkpoint()
        events.append("published")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for name in ("a", "b", "c"):
                nursery.start_soon(rollout, name)
            nursery.start_soon(trainer)
    assert events[:2] == ["trainer on", "published"]
    assert sorted(events[2:]) == ["a saw weights", "b saw weights", "c saw weights"]


async def test_a_cancelled_settle_does_not_hold_back_the_others(either_clock: trio.testing.MockClock | None) -> None:
    # The trainer's settle is cancelled while it waits: the rollouts' round must
    # not stay reserved for it.
    done: list[str] = []

    async def rollout() -> None:
        await settle()
        done.append("rollout")

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as trainer_scope:
                nursery.start_soon(rollout)
                trainer_scope.cancel()
                await settle(TRAINER_FIRST)
    assert trainer_scope.cancelled_caught and done == ["rollout"]


async def test_a_settle_cancelled_while_it_waits_passes_the_wait_to_one_parked_behind_it(
    either_clock: trio.testing.MockClock | None,
) -> None:
    done: list[str] = []

    async def first(scope: trio.CancelScope) -> None:
        with scope:
            await settle()
            done.append("first")

    async def second() -> None:
        await settle()
        done.append("second")

    scope = trio.CancelScope()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(first, scope)
            await trio.lowlevel.checkpoint()  # runnable, so no idle moment yet: first waits for one
            nursery.start_soon(second)
            await trio.lowlevel.checkpoint()  # second parks behind first
            await trio.lowlevel.checkpoint()
            scope.cancel()
    assert scope.cancelled_caught and done == ["second"]
