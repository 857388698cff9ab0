"""The admission gate: how many admission slots the trainer has freed, for the dataloader to wait on."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import trio

from .work import WorkItem


@dataclass(frozen=True)
class ConsumptionGateStatistics:
    """What :meth:`ConsumptionGate.statistics` returns.

    Attributes:
        consumed: groups the trainer has consumed so far.
        tasks_waiting: tasks (the dataloader) waiting for the next consumption.
    """

    consumed: int
    tasks_waiting: int


class ConsumptionGate:
    """Counts the admission slots freed by the trainer, each exactly once.

    An item takes a slot when it is handed out for the first time (attempt 0).
    Its slot is freed at the first fate of its group: trained (its step's
    weights published), skipped, filtered, dropped, or resampled. A copy
    handed out again holds no slot, so whatever becomes of it (trained,
    resampled again, dropped) frees nothing: counting it too would let
    one more fresh item in per resample, beyond the bound the dataloader keeps.

    The trainer is its only writer. The dataloader waits on it to bound what is
    handed out but not yet consumed: an item is handed out once ``consumed``
    reaches the threshold its schedule gives it. Each change sets the current
    event and swaps in a fresh one, so no waiter misses a change and no event is
    reused.
    """

    def __init__(self) -> None:
        self.consumed = 0
        self._changed = trio.Event()

    def statistics(self) -> ConsumptionGateStatistics:
        """How many groups were consumed, and who waits for more, as Trio's primitives report themselves."""
        return ConsumptionGateStatistics(self.consumed, self._changed.statistics().tasks_waiting)

    def free(self, items: Iterable[WorkItem]) -> None:
        """Free the slots of ``items``' groups, which have met a fate, and wake the waiters.

        Args:
            items: work items whose groups were trained, skipped, filtered,
                dropped or resampled; those handed out again (``attempt > 0``)
                hold no slot and are passed over.
        """
        n = sum(1 for item in items if item.attempt == 0)
        if n == 0:
            return
        self.consumed += n
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def wait_for_change(self) -> None:
        """Return at the next :meth:`free` that frees a slot.

        Check the condition you wait for, then call this with no checkpoint in
        between: a change after the check always wakes you.
        """
        await self._changed.wait()
