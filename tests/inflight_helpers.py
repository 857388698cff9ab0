"""Publishing in-flight weights between two chosen decode steps of an in-process engine, without sleeps.

The local engines run every torch job (decode steps, training-client jobs such
as a publish) under the backend's one-token ``CapacityLimiter``, and Trio hands
a released token to the first task parked on it. So a publish whose job is
parked on the limiter before step ``n`` ends runs after step ``n`` and before
step ``n + 1``, which the engine asks for only once step ``n`` has returned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing


def publish_after_step(
    engine: Any,
    step: int,
    publish: Callable[[], Awaitable[Any]],
    limiter: trio.CapacityLimiter,
    nursery: trio.Nursery,
) -> list[Any]:
    """Make ``publish()`` run right after the engine's ``step``-th decode step, before the next one.

    Wraps the engine's ``_step``: when step ``step`` has run, still in its worker
    thread (which holds the limiter's one token), it starts ``publish`` as a task
    in ``nursery`` and waits until every task is blocked, by then that task's job
    on the limiter.

    Returns:
        A list that receives ``publish()``'s result once it has run.
    """
    original = engine._step
    steps = 0
    published: list[Any] = []

    async def run() -> None:
        published.append(await publish())

    async def queue() -> None:
        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        assert limiter.statistics().tasks_waiting >= 1, "the publish job is not parked on the limiter"

    def counted(admit: Any) -> Any:
        nonlocal steps
        result = original(admit)
        steps += 1
        if steps == step:
            trio.from_thread.run(queue)
        return result

    engine._step = counted
    return published
