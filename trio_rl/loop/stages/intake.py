"""The trainer's receive side: each delivered group classified by the schedule, its verdict carried out."""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import replace

import trio

from ...base.determinism import TRAINER_FIRST, settle
from ..schedules import Minibatch, Need, StepClock, Verdict
from ..work import Delivery, FinishedGroup, WorkItem
from .run import Run


class GroupIntake:
    """The trainer's receive side: every group delivered is sorted by the schedule, and its verdict carried out here.

    This is the one place where a group's fate before its step is carried out
    and counted: skipped, filtered, resampled or dropped. A group that leaves
    this way is retired from the ledger (unless it is sampled again) and frees
    its admission slot at once: a step may wait for groups that are only
    admitted once slots held by failed groups are free, and a straggler that
    kept its slot through every retry would starve the run.

    Whether a group sent back is sampled again or dropped depends on whether
    the dataloader is done, so it is decided only at the end of an instant,
    once every task due then has run (:func:`~trio_rl.base.determinism.settle`),
    and never by which of the trainer and the dataloader Trio ran first.
    """

    def __init__(
        self,
        groups: trio.MemoryReceiveChannel[Delivery],
        run: Run,
        resample: trio.MemorySendChannel[WorkItem] | None,
        stop_rollouts: trio.CancelScope,
    ) -> None:
        self._groups = groups
        self._stop_rollouts = stop_rollouts
        self._schedule = run.schedule
        self._ledger = run.ledger
        self._gate = run.gate
        self._weights = run.weights
        self._resample = resample
        self.ended = False
        """Whether every worker has exited (the channel reached ``EndOfChannel``)."""
        self.requeued = self.dropped_stale = self.groups_skipped = 0
        self._filtered: list[FinishedGroup] = []
        self._sent_back: list[WorkItem] = []
        # When this run's first step and the current one began, and the data ended (Trio's clock).
        self._first: tuple[int, float] | None = None
        self._step_start = 0.0
        self._data_ended: float | None = None
        self._gave_up = False

    def expire(self, step: int) -> None:
        """Note that ``step`` begins, and resample the held groups it may no longer train."""
        self._step_start = trio.current_time()
        self._first = self._first or (step, self._step_start)
        self._sent_back.extend(self._schedule.expired(step))

    async def next_minibatch(self, step: int) -> Minibatch | None:
        """Receive what the schedule needs, then its decision: the next minibatch of ``step``, or None."""
        while (need := self._schedule.need(step, self.ended)) is Need.ANOTHER_GROUP:
            await self._receive(step)
        if need is Need.THIS_INSTANT or self._sent_back:
            await self.sort_this_instant(step)
        return self._schedule.next_minibatch(step)

    async def sort_this_instant(self, step: int) -> None:
        """Sort, for ``step``, every group delivered by the end of the current instant; send back what is resampled."""
        if not self.ended:
            await settle(TRAINER_FIRST)
            self._sort_ready(step)
        if self._resample is not None:
            self._ledger.read_notes()
            if self._data_ended is None and self._ledger.dataloader_done:
                self._data_ended = trio.current_time()
        if self._sent_back:
            self._send_back()

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
        """Wait for a group and sort it; past the schedule's patience, give up the rollouts still running."""
        if self._sent_back or (self._resample is not None and self._data_ended is None):
            if not self._sent_back and self._sort_ready(step):
                return  # no wait: groups had arrived
            # Waiting needs what was sent back handed on, and the end of data seen, at a settled instant.
            await self.sort_this_instant(step)
            if self._schedule.need(step, self.ended) is not Need.ANOTHER_GROUP:
                return
        deadline = self._patience(step)
        # A scope only where there is a deadline: most waits have none.
        with trio.move_on_at(deadline) if deadline < math.inf else nullcontext():
            try:
                self._sort(await self._groups.receive(), step)
            except trio.EndOfChannel:
                self.ended = True
            return
        await self.sort_this_instant(step)
        if self._schedule.need(step, self.ended) is Need.ANOTHER_GROUP:
            # Each one delivers as given up, and is dropped: the data has ended.
            self._gave_up = True
            self._weights.give_up_all()

    def _patience(self, step: int) -> float:
        if self._gave_up or self._first is None or self._data_ended is None:
            return math.inf
        first_step, first_start = self._first
        clock = StepClock(first_start, self._step_start, step - first_step, self._data_ended)
        at = self._schedule.stop_waiting_at(clock)
        return math.inf if at is None else at

    def _sort_ready(self, step: int) -> int:
        """Sort every group already delivered; how many there were."""
        sorted_ = 0
        while True:
            try:
                self._sort(self._groups.receive_nowait(), step)
            except trio.WouldBlock:
                return sorted_
            except trio.EndOfChannel:
                self.ended = True
                return sorted_
            sorted_ += 1

    def _sort(self, delivery: Delivery, step: int) -> None:
        verdict = self._schedule.sort(delivery, step)
        if verdict is Verdict.SKIP:
            self.groups_skipped += 1
            self._ledger.retire([delivery.item.key])
            self._gate.consume(1)
        elif verdict is Verdict.RESAMPLE:
            self._sent_back.append(delivery.item)
        elif verdict is Verdict.FILTER:
            assert isinstance(delivery, FinishedGroup), "only a finished group has rewards to filter on"
            self._filtered.append(delivery)
            self._ledger.retire([delivery.item.key])
            self._gate.consume(1)

    def _send_back(self) -> None:
        """Hand what is to be sampled again to the dataloader, in dataset order; once it is done, drop it."""
        assert self._resample is not None, "a schedule that resamples opens the back edge (Schedule.resamples)"
        items, self._sent_back = sorted(self._sent_back, key=lambda item: (item.key, item.attempt)), []
        for item in items:
            try:
                self._resample.send_nowait(replace(item, attempt=item.attempt + 1))
            except trio.BrokenResourceError:
                # The dataloader closed the back edge: the data has run out.
                self.dropped_stale += 1
                self._ledger.retire([item.key])
            else:
                self.requeued += 1
        # A resampled item is handed out again ahead of fresh ones and needs no slot.
        self._gate.consume(len(items))
