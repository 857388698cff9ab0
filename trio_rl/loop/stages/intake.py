"""The trainer's receive side: each delivered group classified by the schedule, its verdict carried out."""

from __future__ import annotations

import math
from contextlib import nullcontext

import trio

from ...base.determinism import TRAINER_FIRST, settle
from ...observe.spans import span
from ..schedules import Minibatch, Need, Verdict
from ..work import Delivery, FinishedGroup
from .run import Run


class GroupIntake:
    """The trainer's receive side: every group delivered is classified by the schedule, and its verdict carried out here.

    This is the one place where a group's fate before its step is carried out
    and counted: skipped, filtered, resampled or dropped. A group that leaves
    this way is retired from the ledger (unless it is resampled) and frees
    its admission slot at once: a step may wait for groups that are only
    admitted once slots held by failed groups are free, and a straggler that
    kept its slot through every retry would starve the run.

    A group to be resampled goes to the run's
    :class:`~trio_rl.loop.resampling.Resampling`, which does the rest (a run
    whose schedule never resamples has a ``NoResampling``, which does nothing).
    """

    def __init__(self, groups: trio.MemoryReceiveChannel[Delivery], run: Run, stop_rollouts: trio.CancelScope) -> None:
        self._groups = groups
        self._stop_rollouts = stop_rollouts
        self._schedule = run.schedule
        self._ledger = run.ledger
        self._gate = run.gate
        self._resampling = run.resampling
        self.ended = False
        """Whether every worker has exited (the channel reached ``EndOfChannel``)."""
        self.groups_skipped = 0
        self._filtered: list[FinishedGroup] = []

    @property
    def resampled(self) -> int:
        """Groups resampled so far."""
        return self._resampling.resampled

    @property
    def dropped(self) -> int:
        """Groups to be resampled that were dropped instead, the data having ended."""
        return self._resampling.dropped

    def expire(self, step: int) -> None:
        """Note that ``step`` begins, and resample the held groups it may no longer train."""
        self._resampling.step_begins(step)

    async def next_minibatch(self, step: int) -> Minibatch | None:
        """Receive what the schedule needs, then its decision: the next minibatch of ``step``, or None."""
        while (need := self._schedule.need(step, self.ended)) is Need.ANOTHER_GROUP:
            await self._receive(step)
        if need is Need.THIS_INSTANT or self._resampling.pending:
            await self.classify_this_instant(step)
        return self._schedule.next_minibatch(step)

    async def classify_this_instant(self, step: int) -> None:
        """Classify, for ``step``, every group delivered by the end of the current instant, and hand on what is resampled."""
        if not self.ended:
            await settle(TRAINER_FIRST)
            self._classify_ready(step)
        self._resampling.end_instant()

    async def stop(self) -> None:
        """Cancel the rollouts still running and drop what they deliver: those items stay owed, and a resume samples them."""
        self._stop_rollouts.cancel()
        async for _ in self._groups:
            pass

    def take_filtered(self) -> list[FinishedGroup]:
        """The groups filtered out on arrival since the last call, for the trainer's record."""
        filtered, self._filtered = self._filtered, []
        return filtered

    async def _receive(self, step: int) -> None:
        """Wait for a group and classify it; past the schedule's patience, give up the rollouts still running."""
        resampling = self._resampling
        if resampling.settles_before_waiting:
            if not resampling.pending and self._classify_ready(step):
                return  # no wait: groups had arrived
            # Waiting needs what was resampled handed on, and the end of data seen, at a settled instant.
            await self.classify_this_instant(step)
            if self._schedule.need(step, self.ended) is not Need.ANOTHER_GROUP:
                return
        deadline = resampling.patience(step)
        # A scope only where there is a deadline: most waits have none.
        with trio.move_on_at(deadline) if deadline < math.inf else nullcontext():
            try:
                with span("wait_for_groups"):
                    delivery = await self._groups.receive()
                self._classify(delivery, step)
            except trio.EndOfChannel:
                self.ended = True
            return
        await self.classify_this_instant(step)
        if self._schedule.need(step, self.ended) is Need.ANOTHER_GROUP:
            # Only a deadline, so only resampling, leads here. Each rollout
            # running delivers as given up, and is dropped: the data has ended.
            resampling.give_up_all()

    def _classify_ready(self, step: int) -> int:
        """Classify every group already delivered; how many there were."""
        classified = 0
        while True:
            try:
                self._classify(self._groups.receive_nowait(), step)
            except trio.WouldBlock:
                return classified
            except trio.EndOfChannel:
                self.ended = True
                return classified
            classified += 1

    def _classify(self, delivery: Delivery, step: int) -> None:
        verdict = self._schedule.classify(delivery, step)
        if verdict is Verdict.SKIP:
            self.groups_skipped += 1
            self._ledger.retire([delivery.item.key])
            self._gate.free([delivery.item])
        elif verdict is Verdict.RESAMPLE:
            self._resampling.add(delivery.item)
        elif verdict is Verdict.FILTER:
            assert isinstance(delivery, FinishedGroup), "only a finished group has rewards to filter on"
            self._filtered.append(delivery)
            self._ledger.retire([delivery.item.key])
            self._gate.free([delivery.item])
