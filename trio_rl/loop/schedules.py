"""One schedule per training mode: everything that differs between sync, stream, pace, requeue and oldest_first.

| mode | a work item samples from | a step trains | resampled |
|---|---|---|---|
| :class:`Sync` | exactly the weights of its step (dataset batch ``s`` is step ``s``) | its batch, split into ``num_substeps`` optimizer steps | nothing |
| :class:`Stream` | as Sync | its batch in ``num_minibatches`` minibatches, each submitted as soon as it fills | nothing |
| :class:`Pace` | weights at most K steps older than its step (group ``n`` is step ``n // B``) | its B groups, in admission order; stragglers are waited for | nothing |
| :class:`Requeue` | the newest weights when it starts | the B oldest groups at most K steps stale | stale groups, while the dataset has data (then they are dropped, and at the end stragglers are given up) |
| :class:`~trio_rl.loop.oldest_first.OldestFirst` | the newest weights when it starts | the B completed groups sampled from the oldest weights, however stale (tinker-cookbook 0.6.1) | nothing |

A schedule decides and does nothing else: it never receives, sends, waits,
counts or touches the ledger. The pipeline's stages ask it:

- the dataloader, for every fresh item, :meth:`Schedule.admit`: which weights it
  may sample from, which step trains it (when that is fixed in advance), and
  how many groups the trainer must have consumed before it is handed out. That
  bound keeps the rollouts in flight, and so the workers, proportional to the work;
- a rollout worker, :attr:`Schedule.samples_exact_version` and
  :meth:`Schedule.gives_up_at`: whether its weights are fixed in advance, and
  when a rollout is too stale to be worth finishing;
- the trainer, for every group it receives, :meth:`Schedule.classify`: keep it for a
  step, skip it (it failed), filter it out, or have it resampled; at each step's start,
  :meth:`Schedule.expired`: kept groups that became too stale; and for each
  minibatch, :meth:`Schedule.need` (must more groups arrive before it is
  decided?), :meth:`Schedule.stop_waiting_at` (until when, once the data has
  ended?) and then :meth:`Schedule.next_minibatch`.

A schedule holds the groups it kept for one run: :func:`~trio_rl.loop.selected_schedule.schedule_for`
builds a fresh one for each run. Nothing else in trio_rl asks which mode a run is in.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections import defaultdict
from dataclasses import dataclass

from ..base.splitting import split_evenly
from ..rl.data import without_constant_rewards
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


class Verdict(enum.Enum):
    """What becomes of a group the trainer received (see :meth:`Schedule.classify`)."""

    KEEP = enum.auto()
    """The schedule holds it for a step."""
    SKIP = enum.auto()
    """It failed beyond its error tolerance: counted, never trained, its slot free at once."""
    RESAMPLE = enum.auto()
    """Too stale (or given up): resampled while the dataset has data, else dropped."""
    FILTER = enum.auto()
    """No learning signal (constant rewards): counted as filtered, its tokens as discarded, never trained, its slot free at once."""


class Need(enum.Enum):
    """What must arrive before the schedule can decide a step's next minibatch (see :meth:`Schedule.need`)."""

    NOTHING = enum.auto()
    """Decide now."""
    ANOTHER_GROUP = enum.auto()
    """Wait for one more group, then ask again."""
    THIS_INSTANT = enum.auto()
    """Take every group delivered by the end of the current instant, then decide.

    So which groups a decision sees does not depend on which of the tasks that
    finish at the same instant ran first."""


@dataclass(frozen=True)
class Minibatch:
    """Groups for one ``forward_backward``, whether an ``optim_step`` follows, and the step's skipped groups it accounts for.

    A step whose groups were all skipped still is a step: its minibatch has no
    groups but a ``skipped`` count, and its weights version is published unchanged.
    """

    groups: list[FinishedGroup]
    optim_step: bool
    skipped: int = 0
    filtered: tuple[FinishedGroup, ...] = ()
    """The groups of ``groups`` the schedule filtered out (constant rewards): the step takes them, and trains none."""

    @property
    def trained(self) -> list[FinishedGroup]:
        """The groups to train: ``groups`` less ``filtered``, in order."""
        if not self.filtered:
            return self.groups
        out = {id(group) for group in self.filtered}
        return [group for group in self.groups if id(group) not in out]


@dataclass(frozen=True)
class StepClock:
    """When the trainer's steps of this run began, and when it saw the data end (Trio's clock).

    Attributes:
        first_start: when this run's first step began.
        start: when the step being prepared began.
        steps: the steps this run began before it.
        data_ended: when the trainer, about to wait, found that every item had
            been handed out and that none could be resampled.
    """

    first_start: float
    start: float
    steps: int
    data_ended: float


def _by_order(group: FinishedGroup) -> tuple[int, int]:
    return group.item.order, group.item.attempt


class Schedule(ABC):
    """What differs between training modes; built, one per run, by :func:`~trio_rl.loop.selected_schedule.schedule_for`.

    Args:
        groups_per_step: B, the groups one step trains (sync and stream: the
            first dataset batch's size, which only names the usual step size).
        num_substeps: optimizer steps per training step.
        staleness_limit: K, how many steps stale a trained group may be (0 on-policy).
        filter_constant: filter out groups whose rewards are all equal
            (``remove_constant_reward_groups``): a step takes them and trains none
            of them (:attr:`Minibatch.filtered`), or, where the schedule says so,
            they are filtered the moment they arrive (:attr:`Verdict.FILTER`).
    """

    resamples = False
    """Whether :meth:`classify` may answer :attr:`Verdict.RESAMPLE` (the run then has a :class:`~trio_rl.loop.resampling.Resampling`)."""

    def __init__(
        self, groups_per_step: int, num_substeps: int = 1, staleness_limit: int = 0, *, filter_constant: bool = False
    ) -> None:
        self.groups_per_step = groups_per_step
        self.num_substeps = num_substeps
        self.staleness_limit = staleness_limit
        self.filter_constant = filter_constant

    @property
    def samples_exact_version(self) -> bool:
        """Whether an item always samples from exactly its ``min_version``.

        On-policy, the next version needs the item's own group, so it cannot be
        published while the item starts: the version is fixed, and no
        :func:`~trio_rl.base.determinism.settle` is needed to choose it.
        """
        return self.staleness_limit == 0

    def gives_up_at(self, version: int) -> int | None:
        """The weights version whose publication makes a rollout sampling from ``version`` useless; None: never."""
        return None

    @abstractmethod
    def admit(self, position: Position, start_step: int) -> Admission:
        """Which weights a fresh item may use, which step trains it, and when it may start."""

    @abstractmethod
    def classify(self, delivery: Delivery, step: int) -> Verdict:
        """Keep, skip or resample a group received while the trainer prepares ``step``."""

    def expired(self, step: int) -> list[WorkItem]:
        """Items of kept groups that ``step`` may no longer train, to be resampled (asked at each step's start)."""
        return []

    def stop_waiting_at(self, clock: StepClock) -> float | None:
        """Once the data has ended, when a step stops waiting for the rollouts still running (Trio's clock).

        From then on they are given up, counted as dropped, and the step trains
        what it holds. None: it waits for them.
        """
        return None

    @abstractmethod
    def need(self, step: int, ended: bool) -> Need:
        """What must arrive before the next minibatch of ``step`` is decided; ``ended``: no group will arrive."""

    @abstractmethod
    def next_minibatch(self, step: int) -> Minibatch | None:
        """The next minibatch of ``step``, or None when the step has no more."""

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

    def _filtered(self, groups: list[FinishedGroup]) -> tuple[FinishedGroup, ...]:
        """Which of a step's (or a minibatch's) ``groups`` it takes without training them."""
        if not self.filter_constant:
            return ()
        return tuple(group for group in groups if group.summary.constant_reward)

    def _substeps(self, step: int, groups: list[FinishedGroup], skipped: int = 0) -> tuple[int, list[Minibatch]]:
        """``groups`` as ``num_substeps`` minibatches with an ``optim_step`` each (a group is never split)."""
        chunks = [chunk for chunk in split_evenly(groups, self.num_substeps) if chunk] or ([[]] if skipped else [])
        filtered = {id(group) for group in self._filtered(groups)}
        return step, [
            Minibatch(
                chunk,
                optim_step=True,
                skipped=skipped if i == 0 else 0,
                filtered=tuple(group for group in chunk if id(group) in filtered),
            )
            for i, chunk in enumerate(chunks)
        ]


def _on_policy_admission(position: Position, start_step: int) -> Admission:
    # A batch is handed out once the step before the previous one has been
    # trained, so its envs are made while the previous step collects and trains.
    step = start_step + position.batch_number
    return Admission(
        min_version=step, step=step, step_size=position.batch_size, consumed_before=position.previous_batch_start
    )


class _StepsKnownInAdvance(Schedule):
    """Schedules whose admission names each item's step and that step's size: Sync, Pace and Stream."""

    def __init__(
        self, groups_per_step: int, num_substeps: int = 1, staleness_limit: int = 0, *, filter_constant: bool = False
    ) -> None:
        super().__init__(groups_per_step, num_substeps, staleness_limit, filter_constant=filter_constant)
        self._by_step: dict[int, list[FinishedGroup]] = defaultdict(list)
        self._skipped_by_step: dict[int, int] = defaultdict(int)
        # Each step's group count, known once its first group arrives.
        self._sizes: dict[int, int] = {}

    def classify(self, delivery: Delivery, step: int) -> Verdict:
        item_step = delivery.item.step
        assert not isinstance(delivery, AbandonedGroup) and item_step is not None
        self._sizes.setdefault(item_step, delivery.item.step_size or 0)
        if isinstance(delivery, SkippedGroup):
            self._skipped_by_step[item_step] += 1
            return Verdict.SKIP
        self._by_step[item_step].append(delivery)
        return Verdict.KEEP

    def _arrived(self, step: int) -> int:
        """The groups of ``step`` received and not yet trained, skipped ones included."""
        return len(self._by_step.get(step, ())) + self._skipped_by_step.get(step, 0)


class _FixedSteps(_StepsKnownInAdvance):
    """Step ``s`` trains exactly the items admitted for it (less those skipped), once all have arrived."""

    def __init__(
        self, groups_per_step: int, num_substeps: int = 1, staleness_limit: int = 0, *, filter_constant: bool = False
    ) -> None:
        super().__init__(groups_per_step, num_substeps, staleness_limit, filter_constant=filter_constant)
        self._planned: tuple[int, list[Minibatch]] = (-1, [])

    def need(self, step: int, ended: bool) -> Need:
        if self._planned[0] == step or ended:
            return Need.NOTHING
        complete = step in self._sizes and self._arrived(step) >= self._sizes[step]
        # Complete, the step is decided after this instant's other deliveries
        # are taken too: a later step's group skipped at the same instant frees
        # its slot (and is counted) now, whatever Trio's task order.
        return Need.THIS_INSTANT if complete else Need.ANOTHER_GROUP

    def next_minibatch(self, step: int) -> Minibatch | None:
        if self._planned[0] != step:
            groups = sorted(self._by_step.pop(step, []), key=_by_order)
            self._sizes.pop(step, None)
            self._planned = self._substeps(step, groups, self._skipped_by_step.pop(step, 0))
        return self._planned[1].pop(0) if self._planned[1] else None


class Sync(_FixedSteps):
    """On-policy: dataset batch ``s`` samples from the weights of step ``s`` and is trained as step ``s``.

    An empty dataset batch has no step. Where constant-reward groups are
    filtered and every group of a step has constant rewards, the step trains
    its first group, as tinker-cookbook 0.6.1's sync loop does.
    """

    def _filtered(self, groups: list[FinishedGroup]) -> tuple[FinishedGroup, ...]:
        if not self.filter_constant:
            return ()
        # remove_constant_reward_groups' own rule, written once (rl/data.py).
        kept = {id(group) for group in without_constant_rewards(groups, lambda group: group.summary.constant_reward)}
        return tuple(group for group in groups if id(group) not in kept)

    def planned_steps(self, num_batches: int, first_batch_size: int) -> int:
        """One step per dataset batch."""
        return num_batches

    def admit(self, position: Position, start_step: int) -> Admission:
        return _on_policy_admission(position, start_step)


class Pace(_FixedSteps):
    """Off-policy without discards: group ``n`` is step ``n // B`` and samples from weights at most K older.

    Nothing is dropped and stragglers are waited for: the strict bound of
    tinker-cookbook PR #822 (unreleased), not 0.6.1's loop (:class:`~trio_rl.OldestFirst`).
    """

    def admit(self, position: Position, start_step: int) -> Admission:
        due = start_step + position.order // self.groups_per_step
        return Admission(
            min_version=max(start_step, due - self.staleness_limit),
            step=due,
            step_size=self.groups_per_step,
            consumed_before=self._async_bound(position.order),
        )


class Stream(_StepsKnownInAdvance):
    """Sync on-policy, with each step's batch trained in minibatches as soon as each fills.

    A minibatch takes the earliest-admitted groups of its step once enough have
    arrived; an ``optim_step`` follows every ``num_minibatches / num_substeps`` minibatches.
    """

    def __init__(
        self, groups_per_step: int, num_minibatches: int, num_substeps: int = 1, *, filter_constant: bool = False
    ) -> None:
        super().__init__(groups_per_step, num_substeps, filter_constant=filter_constant)
        self.num_minibatches = num_minibatches
        self._per_substep = max(1, num_minibatches // num_substeps)
        self._planned: tuple[int, list[int]] = (-1, [])
        self._index = 0

    planned_steps = Sync.planned_steps

    def admit(self, position: Position, start_step: int) -> Admission:
        return _on_policy_admission(position, start_step)

    def need(self, step: int, ended: bool) -> Need:
        if step not in self._sizes:
            return Need.NOTHING if ended else Need.ANOTHER_GROUP
        sizes = self._minibatch_sizes(step)
        if self._index >= len(sizes):
            return Need.NOTHING
        return Need.ANOTHER_GROUP if self._arrived(step) < sizes[self._index] and not ended else Need.THIS_INSTANT

    def next_minibatch(self, step: int) -> Minibatch | None:
        if step not in self._sizes:
            self._by_step.pop(step, None)
            return None
        sizes = self._minibatch_sizes(step)
        if self._index >= len(sizes):
            self._by_step.pop(step, None)
            self._skipped_by_step.pop(step, None)
            self._sizes.pop(step, None)
            return None
        size = sizes[self._index]
        skipped = min(size, self._skipped_by_step[step])
        self._skipped_by_step[step] -= skipped
        pool = sorted(self._by_step[step], key=_by_order)
        taken, self._by_step[step] = pool[: size - skipped], pool[size - skipped :]
        if not taken and not skipped:
            return None
        self._index += 1
        optim_step = self._index % self._per_substep == 0
        return Minibatch(taken, optim_step=optim_step, skipped=skipped, filtered=self._filtered(taken))

    def _minibatch_sizes(self, step: int) -> list[int]:
        if self._planned[0] != step:
            sizes = [len(part) for part in split_evenly(range(self._sizes[step]), self.num_minibatches)]
            self._planned, self._index = (step, [s for s in sizes if s]), 0
        return self._planned[1]


class Requeue(Schedule):
    """Off-policy that never waits for stragglers: train the oldest fresh groups, resample stale ones.

    A rollout still running when its weights become more than K steps old is
    given up and resampled too. Whether a group is resampled is settled at the
    end of the instant its verdict falls (once every task due then has run): it
    is if the dataloader still had data then, and it is dropped and counted
    (``async/dropped_stale``) otherwise, so the choice never depends on which
    task Trio ran first. This is tinker-cookbook 0.5.5's policy
    (``do_async_training``: stale groups resampled until the dataloader is done,
    discarded after), except that 0.5.5 never gives up a running rollout and
    leaves a last, partial batch untrained.

    At the end of data (every item handed out, none can be resampled) no
    newer weights are published while a step waits, so none would be given up
    and the last step would wait for its slowest rollout, 0.5.5 too. Here time
    stands in for the versions that no longer come: a step waits for the
    rollouts still running at most K + 1 times this run's mean step time (from
    its first step's start to this step's), counted from this step's start or
    from when the trainer, about to wait, found the data ended, whichever is
    later (:class:`StepClock`). Then every rollout still running is given up,
    dropped and counted like a stale group, and the step trains what it holds:
    a final, smaller step, or none. A run's first step has no pace to go by and
    waits (``per_rollout_timeout`` bounds it).

    Kept groups are pooled by the weights version they were sampled from, so
    expiring stale ones touches only the versions that fell out of the window,
    never the whole pool.
    """

    resamples = True

    def __init__(
        self, groups_per_step: int, num_substeps: int = 1, staleness_limit: int = 0, *, filter_constant: bool = False
    ) -> None:
        super().__init__(groups_per_step, num_substeps, staleness_limit, filter_constant=filter_constant)
        self._by_version: dict[int, list[FinishedGroup]] = defaultdict(list)
        self._fresh = 0
        self._planned: tuple[int, list[Minibatch]] = (-1, [])

    @property
    def samples_exact_version(self) -> bool:
        """Never: an item samples from the newest weights when it starts."""
        return False

    def gives_up_at(self, version: int) -> int | None:
        return version + self.staleness_limit + 1

    def stop_waiting_at(self, clock: StepClock) -> float | None:
        if clock.steps == 0:
            return None
        mean_step = (clock.start - clock.first_start) / clock.steps
        return max(clock.start, clock.data_ended) + (self.staleness_limit + 1) * mean_step

    def admit(self, position: Position, start_step: int) -> Admission:
        return Admission(
            min_version=start_step, step=None, step_size=None, consumed_before=self._async_bound(position.order)
        )

    def classify(self, delivery: Delivery, step: int) -> Verdict:
        if isinstance(delivery, SkippedGroup):
            # Never resampled: a failed group is skipped, as in the cookbook.
            return Verdict.SKIP
        if isinstance(delivery, AbandonedGroup) or step - delivery.version > self.staleness_limit:
            return Verdict.RESAMPLE
        self._by_version[delivery.version].append(delivery)
        self._fresh += 1
        return Verdict.KEEP

    def expired(self, step: int) -> list[WorkItem]:
        items: list[WorkItem] = []
        for version in sorted(v for v in self._by_version if v < step - self.staleness_limit):
            groups = sorted(self._by_version.pop(version), key=_by_order)
            self._fresh -= len(groups)
            items.extend(group.item for group in groups)
        return items

    def need(self, step: int, ended: bool) -> Need:
        if self._planned[0] == step:
            return Need.NOTHING
        return Need.ANOTHER_GROUP if not ended and self._fresh < self.groups_per_step else Need.THIS_INSTANT

    def next_minibatch(self, step: int) -> Minibatch | None:
        if self._planned[0] != step:
            self._planned = self._substeps(step, self._take_oldest(self.groups_per_step))
        return self._planned[1].pop(0) if self._planned[1] else None

    def _take_oldest(self, count: int) -> list[FinishedGroup]:
        batch: list[FinishedGroup] = []
        for version in sorted(self._by_version):
            groups = sorted(self._by_version[version], key=_by_order)
            taken, rest = groups[: count - len(batch)], groups[count - len(batch) :]
            batch.extend(taken)
            if rest:
                self._by_version[version] = rest
            else:
                del self._by_version[version]
            if len(batch) == count:
                break
        self._fresh -= len(batch)
        return sorted(batch, key=_by_order)
