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

import trio
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


async def settle() -> None:
    """Wait until everything scheduled for the current instant has run.

    Under a :class:`trio.testing.MockClock` this sleeps :data:`SETTLE_S`, which
    with autojump waits until every task is blocked: the guarantee that makes a
    run reproducible. Under any other clock, real time, where no order is
    reproducible anyway, it is one checkpoint: the caller runs again at the next
    scheduler pass, which is all the short sleep achieved there too (Trio runs a
    pass's tasks in either order), without a deadline that ends in a
    cancellation, a cost the pipeline paid once per group.
    """
    if isinstance(trio.lowlevel.current_clock(), MockClock):
        await trio.sleep(SETTLE_S)
    else:
        await trio.lowlevel.checkpoint()
