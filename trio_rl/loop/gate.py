"""The admission gate: how many groups the trainer has consumed, for the dataloader to wait on."""

from __future__ import annotations

from dataclasses import dataclass

import trio


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
    """Counts groups the trainer has consumed: trained (its step's weights published), skipped, filtered, resampled or dropped.

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

    def consume(self, n: int = 1) -> None:
        """Record ``n`` more consumed groups and wake the waiters."""
        if n <= 0:
            return
        self.consumed += n
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    async def wait_for_change(self) -> None:
        """Return at the next :meth:`consume`.

        Check the condition you wait for, then call this with no checkpoint in
        between: a change after the check always wakes you.
        """
        await self._changed.wait()
