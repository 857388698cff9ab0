"""One schedule per training mode: everything that differs between sync, stream, pace and requeue.

| mode | a work item samples from | a step trains | back edge |
|---|---|---|---|
| :class:`Sync` | exactly the weights of its step (dataset batch ``s`` is step ``s``) | its batch, split into ``num_substeps`` optimizer steps | no |
| :class:`Stream` | as Sync | its batch in ``num_minibatches`` minibatches, each submitted as soon as it fills | no |
| :class:`Pace` | weights at most K steps older than its step (group ``n`` is step ``n // B``) | its B groups, in admission order; stragglers are waited for | no |
| :class:`Requeue` | the newest weights when it starts | the B oldest groups at most K steps stale; staler ones go back to the dataloader (or are dropped once the data has run out) | yes |

A schedule answers two questions and nothing else:

- :meth:`Schedule.admit`, asked by the dataloader for every fresh item: which
  weights it may sample from, which step trains it (when that is fixed in
  advance), and how many groups the trainer must have consumed before the item
  is handed out. That last bound is what keeps the number of rollouts in
  flight, and so the number of workers, proportional to the real work.
- :meth:`Schedule.planner`, used by the trainer alone: how delivered groups
  become :class:`StepPlan`\\ s (which groups, in which minibatches, with which
  ``optim_step`` boundaries).

Nothing else in trio_rl asks which mode a run is in.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass, replace

import trio

from ..rl.data import split_evenly
from .determinism import settle
from .gate import ConsumptionGate
from .ledger import DataLedger
from .work import AbandonedGroup, Delivery, FinishedGroup, SkippedGroup, WorkItem


@dataclass(frozen=True)
class Position:
    """Where a fresh item stands among the items of this run.

    Attributes:
        order: its index among the fresh items of this run.
        batch_number: the index of its dataset batch among this run's non-empty batches.
        batch_start: ``order`` of its batch's first item.
        previous_batch_start: ``order`` of the previous batch's first item (0 for the first batch).
        batch_size: the items of its batch that this run hands out.
    """

    order: int
    batch_number: int
    batch_start: int
    previous_batch_start: int
    batch_size: int


@dataclass(frozen=True)
class Admission:
    """A schedule's answer for one fresh item (see :meth:`Schedule.admit`)."""

    min_version: int
    step: int | None
    step_size: int | None
    consumed_before: int


@dataclass(frozen=True)
class Minibatch:
    """Groups for one ``forward_backward``, and whether an ``optim_step`` follows it."""

    groups: list[FinishedGroup]
    optim_step: bool


class StepPlan(ABC):
    """The minibatches of one training step, handed out as they become available.

    ``skipped`` counts the step's groups that failed beyond their error
    tolerance; a step with no group to train but some skipped is still a step
    (its weights version is published unchanged), not the end of data.
    """

    skipped = 0

    @abstractmethod
    async def next_minibatch(self) -> Minibatch | None:
        """The next minibatch, or None when the step has no more."""


class FixedStepPlan(StepPlan):
    """A step whose groups are all known: ``num_substeps`` minibatches, each with an ``optim_step``.

    Substeps split the groups (not the Datums) evenly, so a group's data is never
    split across two optimizer steps.
    """

    def __init__(self, groups: list[FinishedGroup], num_substeps: int, skipped: int = 0) -> None:
        self._chunks = [chunk for chunk in split_evenly(groups, num_substeps) if chunk]
        self.skipped = skipped

    async def next_minibatch(self) -> Minibatch | None:
        return Minibatch(self._chunks.pop(0), optim_step=True) if self._chunks else None


class StepPlanner(ABC):
    """Turns delivered groups into step plans; owned by the trainer task."""

    requeued = 0
    """Groups sent back to the dataloader to be sampled again."""
    dropped_stale = 0
    """Groups dropped as too stale after the data ran out."""
    groups_skipped = 0
    """Groups that failed beyond their error tolerance (see :class:`SkippedGroup`)."""

    def _skip(self, run: PlannerInputs, group: SkippedGroup) -> None:
        """Count a skipped group and retire it at once: no longer owed, its admission slot free.

        Freeing the slot now (not when a step ends) matters: a step may wait for
        groups that are only admitted once slots held by failed groups are free.
        """
        self.groups_skipped += 1
        run.ledger.retire([group.item.key])
        run.gate.consume(1)

    @abstractmethod
    async def next_step(self, step: int) -> StepPlan | None:
        """The plan of ``step``, or None when no group is left to train."""


class GroupInbox:
    """The trainer's receive side of the groups channel, with the end of data as a flag."""

    def __init__(self, receive: trio.MemoryReceiveChannel[Delivery]) -> None:
        self._receive = receive
        self.ended = False
        """Whether every worker has exited (the channel reached ``EndOfChannel``)."""

    async def receive(self) -> Delivery | None:
        """The next delivery, or None once the data has ended."""
        if self.ended:
            return None
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            self.ended = True
            return None

    async def receive_ready(self) -> list[Delivery]:
        """Everything delivered by the end of the current instant, without waiting for more.

        Which groups a decision sees must not depend on which of the tasks that
        finish at the same instant ran first, so :func:`settle` comes first.
        """
        if self.ended:
            return []
        await settle()
        ready: list[Delivery] = []
        while True:
            try:
                ready.append(self._receive.receive_nowait())
            except trio.WouldBlock:
                return ready
            except trio.EndOfChannel:
                self.ended = True
                return ready


@dataclass(frozen=True)
class PlannerInputs:
    """What a planner may use: the trainer's inbox, and for the back edge, the gate, ledger and requeue channel."""

    inbox: GroupInbox
    gate: ConsumptionGate
    ledger: DataLedger
    requeue: trio.MemorySendChannel[WorkItem] | None


class Schedule(ABC):
    """What differs between training modes; built by :meth:`trio_rl.Config.schedule`.

    Args:
        groups_per_step: B, the groups one step trains (sync and stream: the
            first dataset batch's size, which only names the usual step size).
        num_substeps: optimizer steps per training step.
        staleness_limit: K, how many steps stale a trained group may be (0 on-policy).
    """

    back_edge = False
    """Whether the trainer sends stale work back to the dataloader."""

    def __init__(self, groups_per_step: int, num_substeps: int = 1, staleness_limit: int = 0) -> None:
        self.groups_per_step = groups_per_step
        self.num_substeps = num_substeps
        self.staleness_limit = staleness_limit

    @property
    def abandons_stale_rollouts(self) -> bool:
        """Whether a rollout is given up once its weights are more than K steps old."""
        return self.back_edge

    @property
    def samples_exact_version(self) -> bool:
        """Whether an item always samples from exactly its ``min_version``.

        On-policy, the next version needs the item's own group, so it cannot be
        published while the item starts: the version is fixed, and no
        :func:`~trio_rl.loop.determinism.settle` is needed to choose it.
        """
        return self.staleness_limit == 0 and not self.back_edge

    @abstractmethod
    def admit(self, position: Position, start_step: int) -> Admission:
        """Which weights a fresh item may use, which step trains it, and when it may start."""

    @abstractmethod
    def planner(self, run: PlannerInputs) -> StepPlanner:
        """A fresh planner for one run's trainer."""

    def planned_steps(self, num_batches: int, first_batch_size: int) -> int:
        """How many steps a run over the whole dataset expects (for ``progress/done_frac``).

        Off-policy steps take ``groups_per_step`` groups each, estimated from
        the first batch's size.
        """
        return math.ceil(num_batches * first_batch_size / self.groups_per_step)

    def _async_bound(self, order: int) -> int:
        # At most B * (K + 1) groups handed out and not yet consumed: every one
        # of them can still be trained within K steps of the weights it starts on.
        return max(0, order - self.groups_per_step * (self.staleness_limit + 1) + 1)


class Sync(Schedule):
    """On-policy: dataset batch ``s`` samples from the weights of step ``s`` and is trained as step ``s``.

    A batch is handed out as soon as the step before the previous one has
    been trained, so its envs are made while the previous step collects and
    trains. An empty dataset batch has no step.
    """

    def planned_steps(self, num_batches: int, first_batch_size: int) -> int:
        """One step per dataset batch."""
        return num_batches

    def admit(self, position: Position, start_step: int) -> Admission:
        step = start_step + position.batch_number
        return Admission(
            min_version=step, step=step, step_size=position.batch_size, consumed_before=position.previous_batch_start
        )

    def planner(self, run: PlannerInputs) -> StepPlanner:
        return FixedStepPlanner(run, self.num_substeps)


class Pace(Schedule):
    """Off-policy without discards: group ``n`` is step ``n // B`` and samples from weights at most K older.

    Nothing is dropped and stragglers are waited for, as in tinker-cookbook 0.6.1.
    """

    def admit(self, position: Position, start_step: int) -> Admission:
        due = start_step + position.order // self.groups_per_step
        return Admission(
            min_version=max(start_step, due - self.staleness_limit),
            step=due,
            step_size=self.groups_per_step,
            consumed_before=self._async_bound(position.order),
        )

    def planner(self, run: PlannerInputs) -> StepPlanner:
        return FixedStepPlanner(run, self.num_substeps)


class Stream(Sync):
    """Sync on-policy, with each step's batch trained in minibatches as soon as each fills.

    An ``optim_step`` follows every ``num_minibatches / num_substeps`` minibatches.
    """

    def __init__(self, groups_per_step: int, num_minibatches: int, num_substeps: int = 1) -> None:
        super().__init__(groups_per_step, num_substeps)
        self.num_minibatches = num_minibatches

    def planner(self, run: PlannerInputs) -> StepPlanner:
        return StreamStepPlanner(run, self.num_minibatches, self.num_substeps)


class Requeue(Schedule):
    """Off-policy that never waits for stragglers: train the oldest fresh groups, send stale ones back.

    A rollout still running when its weights become more than K steps old is
    given up and sent back too. Groups sent back while the dataset still has
    data are sampled again; after that they are dropped and counted (the
    behaviour of trio_rl 0.5.5's default).
    """

    back_edge = True

    def admit(self, position: Position, start_step: int) -> Admission:
        return Admission(
            min_version=start_step, step=None, step_size=None, consumed_before=self._async_bound(position.order)
        )

    def planner(self, run: PlannerInputs) -> StepPlanner:
        return RequeueStepPlanner(run, self)


class FixedStepPlanner(StepPlanner):
    """Sync and Pace: step ``s`` trains exactly the items admitted for it (less those skipped)."""

    def __init__(self, run: PlannerInputs, num_substeps: int) -> None:
        self._run = run
        self._num_substeps = num_substeps
        self._by_step: dict[int, list[FinishedGroup]] = defaultdict(list)
        self._skipped_by_step: dict[int, int] = defaultdict(int)
        self._size: dict[int, int] = {}

    async def next_step(self, step: int) -> StepPlan | None:
        while not self._complete(step):
            delivery = await self._run.inbox.receive()
            if delivery is None:
                break
            item_step = delivery.item.step
            assert not isinstance(delivery, AbandonedGroup) and item_step is not None
            self._size[item_step] = delivery.item.step_size or 0
            if isinstance(delivery, SkippedGroup):
                self._skip(self._run, delivery)
                self._skipped_by_step[item_step] += 1
            else:
                self._by_step[item_step].append(delivery)
        groups = sorted(self._by_step.pop(step, []), key=lambda g: g.item.order)
        skipped = self._skipped_by_step.pop(step, 0)
        self._size.pop(step, None)
        return FixedStepPlan(groups, self._num_substeps, skipped) if groups or skipped else None

    def _complete(self, step: int) -> bool:
        arrived = len(self._by_step.get(step, ())) + self._skipped_by_step.get(step, 0)
        return step in self._size and arrived >= self._size[step]


class StreamStepPlanner(StepPlanner):
    """Stream: a step's minibatches fill from its batch's groups in arrival order."""

    def __init__(self, run: PlannerInputs, num_minibatches: int, num_substeps: int) -> None:
        self._run = run
        self._num_minibatches = num_minibatches
        self._per_substep = max(1, num_minibatches // num_substeps)
        self.by_step: dict[int, list[FinishedGroup]] = defaultdict(list)
        self.skipped_by_step: dict[int, int] = defaultdict(int)
        """Skipped groups of each step not yet counted toward one of its minibatches."""
        self.sizes: dict[int, int] = {}
        """Each step's group count, known once its first group arrives."""

    async def next_step(self, step: int) -> StepPlan | None:
        # The first group of the step says how many groups the step has.
        while step not in self.sizes:
            if not await self.receive_one():
                self.by_step.pop(step, None)
                return None
        sizes = [len(part) for part in split_evenly(range(self.sizes[step]), self._num_minibatches)]
        return _StreamPlan(self, step, [s for s in sizes if s])

    async def receive_one(self) -> bool:
        """Receive one group into its step's pool; False at the end of data."""
        delivery = await self._run.inbox.receive()
        if delivery is None:
            return False
        self._add(delivery)
        return True

    def _add(self, delivery: Delivery) -> None:
        step = delivery.item.step
        assert not isinstance(delivery, AbandonedGroup) and step is not None
        self.sizes.setdefault(step, delivery.item.step_size or self._num_minibatches)
        if isinstance(delivery, SkippedGroup):
            self._skip(self._run, delivery)
            self.skipped_by_step[step] += 1
        else:
            self.by_step[step].append(delivery)

    async def take(self, step: int, size: int) -> tuple[list[FinishedGroup], int]:
        """The earliest-admitted groups of ``step`` once ``size`` arrived, and how many of the size were skipped.

        Fewer arrive at the end of data.
        """
        while len(self.by_step[step]) + self.skipped_by_step[step] < size and await self.receive_one():
            pass
        for delivery in await self._run.inbox.receive_ready():
            self._add(delivery)
        skipped = min(size, self.skipped_by_step[step])
        self.skipped_by_step[step] -= skipped
        pool = sorted(self.by_step[step], key=lambda g: g.item.order)
        taken, self.by_step[step] = pool[: size - skipped], pool[size - skipped :]
        return taken, skipped

    def optim_after(self, index: int) -> bool:
        """Whether an ``optim_step`` follows minibatch ``index`` of a step."""
        return (index + 1) % self._per_substep == 0


class _StreamPlan(StepPlan):
    def __init__(self, planner: StreamStepPlanner, step: int, sizes: list[int]) -> None:
        self._planner = planner
        self._step = step
        self._sizes = sizes
        self._index = 0

    async def next_minibatch(self) -> Minibatch | None:
        if self._index >= len(self._sizes):
            self._planner.by_step.pop(self._step, None)
            self._planner.skipped_by_step.pop(self._step, None)
            self._planner.sizes.pop(self._step, None)
            return None
        groups, skipped = await self._planner.take(self._step, self._sizes[self._index])
        self.skipped += skipped
        if not groups and not skipped:
            return None
        minibatch = Minibatch(groups, optim_step=self._planner.optim_after(self._index))
        self._index += 1
        return minibatch


class RequeueStepPlanner(StepPlanner):
    """Requeue: the pool of finished groups, by the weights version they were sampled from.

    Retiring stale groups touches only the versions that fell out of the window
    when the step advanced, never the whole pool.
    """

    def __init__(self, run: PlannerInputs, schedule: Requeue) -> None:
        assert run.requeue is not None, "the Requeue schedule needs its back edge"
        self._run = run
        self._inbox = run.inbox
        self._gate = run.gate
        self._ledger = run.ledger
        self._requeue = run.requeue
        self._groups_per_step = schedule.groups_per_step
        self._limit = schedule.staleness_limit
        self._num_substeps = schedule.num_substeps
        self._by_version: dict[int, list[FinishedGroup]] = defaultdict(list)
        self._fresh = 0

    async def next_step(self, step: int) -> StepPlan | None:
        self._retire_older_than(step - self._limit)
        while True:
            if not self._inbox.ended and self._fresh < self._groups_per_step:
                delivery = await self._inbox.receive()
                if delivery is not None:
                    self._add(delivery, step)
                continue
            # Which groups make the batch must not depend on which of the
            # groups finishing at this instant happened to arrive first.
            for delivery in await self._inbox.receive_ready():
                self._add(delivery, step)
            if self._inbox.ended or self._fresh >= self._groups_per_step:
                break
        batch = self._take_oldest(self._groups_per_step)
        return FixedStepPlan(batch, self._num_substeps) if batch else None

    def _add(self, delivery: Delivery, step: int) -> None:
        if isinstance(delivery, SkippedGroup):
            # Never sampled again: a failed group is skipped, as in the cookbook.
            self._skip(self._run, delivery)
            return
        if isinstance(delivery, AbandonedGroup) or step - delivery.version > self._limit:
            self._retire(delivery.item)
            return
        self._by_version[delivery.version].append(delivery)
        self._fresh += 1

    def _retire_older_than(self, version: int) -> None:
        for stale_version in sorted(v for v in self._by_version if v < version):
            groups = sorted(self._by_version.pop(stale_version), key=lambda g: g.item.order)
            self._fresh -= len(groups)
            for group in groups:
                self._retire(group.item)

    def _retire(self, item: WorkItem) -> None:
        """Send ``item`` back to be sampled again or, once the data has run out, drop it."""
        try:
            self._requeue.send_nowait(replace(item, attempt=item.attempt + 1))
        except trio.BrokenResourceError:
            self.dropped_stale += 1
            self._ledger.retire([item.key])
        else:
            self.requeued += 1
        # Either way its admission slot is free again; a requeued item is handed
        # out again ahead of fresh ones and needs none. (A straggler that kept
        # its slot through every retry would, with a few more, starve the run.)
        self._gate.consume(1)

    def _take_oldest(self, count: int) -> list[FinishedGroup]:
        batch: list[FinishedGroup] = []
        for version in sorted(self._by_version):
            groups = sorted(self._by_version[version], key=lambda g: (g.item.order, g.item.attempt))
            taken, rest = groups[: count - len(batch)], groups[count - len(batch) :]
            batch.extend(taken)
            if rest:
                self._by_version[version] = rest
            else:
                del self._by_version[version]
            if len(batch) == count:
                break
        self._fresh -= len(batch)
        return sorted(batch, key=lambda g: (g.item.order, g.item.attempt))
