"""Making results independent of Trio's randomised scheduling order.

Trio runs the tasks that are ready at the same moment in a random order, on
purpose. Two rules keep trio_rl's results identical across runs anyway:

- randomness comes from seeds derived from identities (:func:`derive_seed`),
  never from a generator shared by tasks;
- a decision that depends on "what has happened so far" (which groups make up a
  batch, which weights a rollout samples from) is taken only after
  :func:`settle`, which lets everything that can run first run.
"""

from __future__ import annotations

import hashlib

from trio.lowlevel import ParkingLot, RunVar, Task, current_task
from trio.testing import wait_all_tasks_blocked


def derive_seed(*parts: int | str) -> int:
    """A seed in ``[0, 2**31)`` that depends only on ``parts``, e.g. (seed, batch, group, attempt).

    Hashing, rather than adding or xoring, keeps nearby identities from producing
    related random streams. The range is that of a non-negative int32, because
    servers speaking the Tinker API may store sampling seeds as int32 (SkyRL
    rejects larger ones).
    """
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") >> 1


TRAINER_FIRST = 0
"""The :func:`settle` priority of the trainer's task: at an instant where it and
other tasks settle, it goes on first, alone, and they go on after what it did."""


class _Settling:
    """One run's settling: the one task that waits for the next idle moment, and the others parked by priority.

    Only the leader waits for the idle moment; the others park, and cost
    nothing while they wait, however many idle moments pass before their
    priority's turn.
    """

    def __init__(self) -> None:
        self.leader: Task | None = None
        self.parked: dict[int, ParkingLot] = {}

    def lowest_parked(self) -> int | None:
        waiting = [priority for priority, lot in self.parked.items() if lot]
        return min(waiting) if waiting else None

    def pass_the_lead(self) -> None:
        """The leader goes on (or was cancelled): one of the parked tasks of the lowest priority waits for the next idle moment."""
        lowest = self.lowest_parked()
        self.leader = None if lowest is None else self.parked[lowest].unpark(count=1)[0]


_SETTLING: RunVar[_Settling] = RunVar("trio_rl_settling")


async def settle(priority: int = 1) -> None:
    """Wait until no task can run: everything that was due has happened.

    It waits for an idle moment of the run (:func:`trio.testing.wait_all_tasks_blocked`),
    the same wait under every clock. Under a :class:`trio.testing.MockClock` with
    autojump, the clock moves only once every task is blocked, and Trio wakes
    the waiters of an idle moment before it jumps; so a settled task sees all
    that happened at the current instant, and the instant itself is unchanged:
    the guarantee that makes a run reproducible. Under the real clock the wait
    ends at the first scheduler pass where nothing is runnable and no I/O is
    ready; threads and the network finish when they finish, so there it orders
    nothing that was not ordered anyway.
    A task that never blocks (a loop of ``trio.sleep(0)``) holds every
    settle back until it does.

    Tasks that settle together would go on together, in Trio's random order; so
    at each idle moment only the settling tasks of the lowest ``priority`` go
    on, and the others wait for the next one, after what those did (the
    trainer, :data:`TRAINER_FIRST`, before the rollouts that read what it
    publishes).
    """
    try:
        settling = _SETTLING.get()
    except LookupError:
        settling = _Settling()
        _SETTLING.set(settling)
    me = current_task()
    if settling.leader is None:
        settling.leader = me
    else:
        lot = settling.parked.get(priority)
        if lot is None:
            lot = settling.parked[priority] = ParkingLot()
        await lot.park()
        if settling.leader is not me:
            return  # released with the rest of its priority
    try:
        while True:
            await wait_all_tasks_blocked()
            lowest = settling.lowest_parked()
            if lowest is None or priority < lowest:
                return
            settling.parked[lowest].unpark_all()
            if lowest == priority:
                return
            # Those of a lower priority go on; the lead waits for the next idle moment, after what they did.
    finally:
        settling.pass_the_lead()
