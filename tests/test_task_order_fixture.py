"""The ``trio_task_order_from_seed`` fixture: a seed fixes the order Trio runs ready tasks in, and another seed changes it."""

from __future__ import annotations

import trio

from tests.conftest import TaskOrder


def _order_of_ready_tasks() -> list[int]:
    """The order in which eight tasks, all ready at once, first ran."""
    ran: list[int] = []

    async def one(index: int) -> None:
        await trio.lowlevel.checkpoint()
        ran.append(index)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for index in range(8):
                nursery.start_soon(one, index)

    trio.run(main)
    return ran


def test_one_seed_gives_one_order_and_the_seeds_give_several(trio_task_order_from_seed: TaskOrder) -> None:
    orders = []
    for seed in range(6):
        with trio_task_order_from_seed(seed):
            first = _order_of_ready_tasks()
            assert sorted(first) == list(range(8))
        with trio_task_order_from_seed(seed):
            assert _order_of_ready_tasks() == first
        orders.append(tuple(first))
    # Not vacuous: the seed really reaches Trio's scheduler.
    assert len(set(orders)) > 1
