"""What resampling does beyond deciding: the back edge, the end of data, the patience and giving up.

A schedule decides that a group is to be resampled (:attr:`~trio_rl.loop.schedules.Verdict.RESAMPLE`,
:meth:`~trio_rl.loop.schedules.Schedule.expired`) and when a rollout is too stale to
finish (:meth:`~trio_rl.loop.schedules.Schedule.gives_up_at`). :class:`Resampling`
carries that out, and exists only in a run whose schedule resamples
(:attr:`~trio_rl.loop.schedules.Schedule.resamples`); no other part of the loop
holds any of its state. Other runs have a :class:`NoResampling`, which does
nothing in the same calls, so no stage asks whether its run resamples.

- The back edge: items to resample go from the trainer to the dataloader on
  an unbounded channel (the back edge of a cycle must never block). The dataloader
  closes it when the data runs out, so an item resampled later is dropped and counted.
- Which of the two an item gets depends on whether the dataloader is done, so
  items are handed to the dataloader only at the end of an instant, once every task due then
  has run (:func:`~trio_rl.base.determinism.settle`), never by which of the
  trainer and the dataloader Trio ran first.
- Stale rollouts: a rollout whose weights become too stale is given up the
  moment the version that makes it so is published, through a cancel scope per
  rollout rather than a task per rollout watching the version.
- Patience: once the data has ended no newer weights come to give stragglers
  up, so the schedule's :meth:`~trio_rl.loop.schedules.Schedule.stop_waiting_at`
  bounds the wait, after which every rollout still running is given up.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Generator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import replace

import trio

from .channels import closed_unless_crashed, ready
from .gate import ConsumptionGate
from .ledger import DataLedger
from .schedules import Schedule, StepClock
from .work import WorkItem


class Resampling:
    """The items a run resamples, and the rollouts it gives up; one per run whose schedule resamples.

    Args:
        schedule: the run's schedule (one that resamples).
        ledger: the run's data ledger: a dropped item is retired from it.
        gate: the run's consumption gate: an item resampled frees its slot.
    """

    def __init__(self, schedule: Schedule, ledger: DataLedger, gate: ConsumptionGate) -> None:
        self._schedule = schedule
        self._ledger = ledger
        self._gate = gate
        self._send, self._receive = trio.open_memory_channel[WorkItem](math.inf)
        self._pending: list[WorkItem] = []
        self.resampled = self.dropped = 0
        """Items resampled, and items dropped because the data had ended."""
        # When this run's first step and the current one began, and when the data ended (Trio's clock).
        self._first: tuple[int, float] | None = None
        self._step_start = 0.0
        self._data_ended: float | None = None
        self._expiring: dict[int, list[trio.CancelScope]] = defaultdict(list)
        self._gave_up = False

    # ------------------------------------------------------------ the trainer's side

    def step_begins(self, step: int) -> None:
        """Note that ``step`` begins, and resample the held groups the schedule says it may no longer train."""
        self._step_start = trio.current_time()
        self._first = self._first or (step, self._step_start)
        self._pending.extend(self._schedule.expired(step))

    def add(self, item: WorkItem) -> None:
        """Sample ``item`` again (handed to the dataloader at the end of this instant)."""
        self._pending.append(item)

    @property
    def pending(self) -> bool:
        """Whether items wait to be handed to the dataloader at the end of this instant."""
        return bool(self._pending)

    @property
    def settles_before_waiting(self) -> bool:
        """Whether the trainer must settle the instant before it waits: to send items back, or to see the data end."""
        return bool(self._pending) or self._data_ended is None

    def end_instant(self) -> None:
        """At a settled instant: note whether the data has ended, then hand what is pending to the dataloader, in dataset order."""
        self._ledger.read_notes()
        if self._data_ended is None and self._ledger.dataloader_done:
            self._data_ended = trio.current_time()
        if not self._pending:
            return
        items, self._pending = sorted(self._pending, key=lambda item: (item.key, item.attempt)), []
        for item in items:
            try:
                self._send.send_nowait(replace(item, attempt=item.attempt + 1))
            except trio.BrokenResourceError:
                # The dataloader closed the back edge: the data has run out.
                self.dropped += 1
                self._ledger.retire([item.key])
            else:
                self.resampled += 1
        # A resampled item is handed out again ahead of fresh ones and needs no
        # slot: its first hand-out's slot is freed now, and its copies free none.
        self._gate.free(items)

    def patience(self, step: int) -> float:
        """Until when (Trio's clock) the trainer waits for a group of ``step`` before it gives up the rollouts running."""
        if self._gave_up or self._first is None or self._data_ended is None:
            return math.inf
        first_step, first_start = self._first
        clock = StepClock(first_start, self._step_start, step - first_step, self._data_ended)
        at = self._schedule.stop_waiting_at(clock)
        return math.inf if at is None else at

    def give_up_all(self) -> None:
        """Give up every rollout running, now and from now on: each delivers as given up, and is dropped."""
        self._gave_up = True
        for scopes in self._expiring.values():
            for scope in scopes:
                scope.cancel()
        self._expiring.clear()

    def closed_unless_crashed(self) -> AbstractContextManager[None]:
        """Close the trainer's end of the back edge when the trainer is done (not when it crashed)."""
        return closed_unless_crashed(self._send)

    # ------------------------------------------------------------ the weights' side

    def published(self, version: int) -> None:
        """Weights ``version`` are published: give up the rollouts it makes too stale."""
        for due in [v for v in self._expiring if v <= version]:
            for scope in self._expiring.pop(due):
                scope.cancel()

    # ------------------------------------------------------------ the rollouts' side

    def given_up_when_stale(self, latest: int, version: int) -> AbstractContextManager[object]:
        """A scope cancelled once a rollout sampling from ``version`` is too stale to train on.

        Args:
            latest: the newest version published now.
            version: the version the rollout samples from.
        """
        expiry = self._schedule.gives_up_at(version)
        if expiry is None:
            return nullcontext()
        stale = trio.CancelScope()
        if latest >= expiry or self._gave_up:
            stale.cancel()
        else:
            self._expiring[expiry].append(stale)
        return stale

    # ------------------------------------------------------------ the dataloader's side

    def take_ready(self) -> list[WorkItem]:
        """The items resampled so far, to be handed out again ahead of fresh ones (never waits)."""
        return ready(self._receive)

    def take_last(self) -> list[WorkItem]:
        """The data has run out: the items resampled so far, and the back edge closed in the same step.

        No checkpoint between taking and closing, so nothing resampled is ever
        left unread in the channel's buffer; later items are dropped.
        """
        last = ready(self._receive)
        self._receive.close()
        return last

    @contextmanager
    def dataloader_side(self) -> Generator[None, None, None]:
        """Close the dataloader's end of the back edge however the dataloader ends."""
        with self._receive:
            yield


class NoResampling:
    """The :class:`Resampling` of a run whose schedule never resamples: nothing is resampled, waited out or given up.

    It holds no state; with it the stages carry out resampling the same way in
    every mode, and none of them asks whether the run resamples.
    """

    resampled = dropped = 0
    pending = settles_before_waiting = False

    def step_begins(self, step: int) -> None:
        """Nothing expires: no group is ever resampled."""

    def add(self, item: WorkItem) -> None:
        raise AssertionError("a schedule that resamples has a Resampling (Schedule.resamples)")

    def end_instant(self) -> None:
        """Nothing is pending."""

    def patience(self, step: int) -> float:
        """No bound: nothing is ever given up, so the trainer waits for its groups."""
        return math.inf

    def give_up_all(self) -> None:
        raise AssertionError("only a Resampling's patience ends a wait, and this one has none")

    def closed_unless_crashed(self) -> AbstractContextManager[None]:
        return nullcontext()

    def published(self, version: int) -> None:
        """No rollout waits to be given up."""

    def given_up_when_stale(self, latest: int, version: int) -> AbstractContextManager[object]:
        # No scope: thousands of waiting rollouts would each hold one for nothing.
        return nullcontext()

    def take_ready(self) -> list[WorkItem]:
        return []

    def take_last(self) -> list[WorkItem]:
        return []

    def dataloader_side(self) -> AbstractContextManager[None]:
        return nullcontext()


def resampling_for(schedule: Schedule, ledger: DataLedger, gate: ConsumptionGate) -> Resampling | NoResampling:
    """The run's resampling, chosen once: a :class:`Resampling` where ``schedule`` resamples, else :class:`NoResampling`."""
    return Resampling(schedule, ledger, gate) if schedule.resamples else NoResampling()
