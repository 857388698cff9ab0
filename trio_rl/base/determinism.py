"""Making results independent of Trio's randomised scheduling order.

Trio runs the tasks that are ready at the same moment in a random order, on
purpose. Two rules keep trio_rl's results identical across runs anyway:

- randomness comes from seeds derived from identities (:func:`derive_seed`),
  never from a generator shared by tasks;
- a decision that depends on "what has happened so far" (which groups make up a
  batch, which weights a rollout samples from) is taken only after
  :func:`settle`, which lets everything due at the current instant happen first.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass, field

import trio
from trio.lowlevel import RunVar
from trio.testing import MockClock

SETTLE_S = 1e-9
"""A sleep this short costs one scheduler pass in real time. Under a MockClock
with autojump, the clock only moves once every task is blocked, so waking up
after it means all work due at the previous instant has been done."""


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


@dataclass
class _Settling:
    """The tasks in :func:`settle` in one run, and which priority each instant released."""

    waiting: Counter[tuple[int, float]] = field(default_factory=Counter[tuple[int, float]])
    released: tuple[float, int] = (-1.0, 0)


_SETTLING: RunVar[_Settling] = RunVar("trio_rl_settling")


async def settle(priority: int = 1) -> None:
    """Wait until everything scheduled for the current instant has run.

    Under a :class:`trio.testing.MockClock` this sleeps :data:`SETTLE_S`, which
    with autojump waits until every task is blocked: the guarantee that makes a
    run reproducible. Tasks that settle at the same instant would wake together,
    in Trio's random order; so at each instant only the settling tasks of the
    lowest ``priority`` go on, and the others sleep again until then (the
    trainer, :data:`TRAINER_FIRST`, before the rollouts that read what it
    publishes). Under any other clock, real time, where no order is
    reproducible anyway, it is one checkpoint: the caller runs again at the next
    scheduler pass, which is all the short sleep achieved there too (Trio runs a
    pass's tasks in either order), without a deadline that ends in a
    cancellation, a cost the pipeline paid once per group.
    """
    if not isinstance(trio.lowlevel.current_clock(), MockClock):
        await trio.lowlevel.checkpoint()
        return
    try:
        settling = _SETTLING.get()
    except LookupError:
        settling = _Settling()
        _SETTLING.set(settling)
    entry = (priority, trio.current_time())
    settling.waiting[entry] += 1
    try:
        while True:
            await trio.sleep(SETTLE_S)
            now = trio.current_time()
            if settling.released[0] != now:
                # The first task to wake at this instant decides for all of them,
                # before any of them goes on.
                eligible = [p for (p, since), n in settling.waiting.items() if n and since < now]
                settling.released = (now, min(eligible))
            if settling.released[1] == priority:
                return
    finally:
        settling.waiting[entry] -= 1
        if not settling.waiting[entry]:
            del settling.waiting[entry]
