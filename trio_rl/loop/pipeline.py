"""The run's graph: a dataloader, rollout workers, the trainer and the evaluator, in one nursery.

::

    dataloader ──items──▶ rollout_worker × N ──groups──▶ trainer ──(step, client)──▶ evaluator
       │  ▲                                                │ │
       │  └──────────── resample (Requeue only) ◀──────────┘ │
       └──────────────── handout notes ─────────────────────▶┘ (the data ledger)

Every arrow is a memory channel, and every channel end has one owner that
closes it. The end of data needs no bookkeeping: the dataloader closes
``items`` when the data runs out; each worker's ``async for`` then ends and its
``with`` block closes its clone of ``groups``; when the last clone closes, the
trainer sees ``EndOfChannel``, trains what it holds, and closes the
evaluator's channel. Any exception cancels the whole nursery.

What differs between modes is decided by the run's :class:`~trio_rl.loop.schedules.Schedule`,
which the stages ask and which does nothing itself. This module reads in the
order a group travels: :func:`run_pipeline` wires the stages; the
:func:`dataloader` admits an item and hands it to a :func:`rollout_worker`,
which samples it (:func:`run_work_item`) and sends the finished group to the
trainer; the trainer's :class:`GroupIntake` receives it and carries out the
schedule's verdict on it; the :class:`Trainer` submits each minibatch the
schedule decides (to the :class:`~trio_rl.loop.step_runner.StepRunner`, which
calls ``forward_backward`` and ``optim_step`` and publishes the new weights),
records the step and frees its groups' admission slots; last, the
:func:`evaluator`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Coroutine, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import trio

from ..backends.protocol import SamplingClient
from ..errors import NonFiniteError, stops_the_run
from ..rl.data import assemble_training_data
from ..rl.kl import reference_logprob_diffs
from ..rl.rollouts import ErrorStrategy, ParamsPerCall, SamplingPolicy, TokenPolicy, group_envs, rollout_group
from ..rl.step_metrics import (
    RunCounts,
    final_record,
    group_metrics,
    rollout_tokens,
    step_tokens,
    trained_step_metrics,
)
from ..rl.summary import GroupSummary
from ..types import Metrics, TrajectoryGroup
from .channels import closed_unless_crashed, ready, send_downstream
from .checkpoints import CheckpointKeeper, CheckpointRecord
from .determinism import TRAINER_FIRST, derive_seed, settle
from .evaluation import EvalRequests, EvalSchedule, OwedEvaluations, SamplingClientEvaluator, evaluate
from .gate import ConsumptionGate
from .items import DatasetItems
from .ledger import DataLedger
from .metrics_log import MetricsLog
from .schedules import Minibatch, Need, Schedule, StepClock, Verdict
from .step_runner import StepRunner, TrainedStep
from .weights import LatestWeights
from .work import AbandonedGroup, Delivery, FinishedGroup, Handout, ItemKey, SkippedGroup, WorkItem

EVAL_QUEUE_SIZE = 4
"""Due evaluations that may wait while the evaluator is busy before the trainer waits too."""


@dataclass(frozen=True)
class Run:
    """What every stage of one run shares; built by :func:`trio_rl.train`.

    Attributes:
        start_step: the step this run starts at (0, or the step resumed from).
        schedule: the mode's decisions (one fresh schedule per run).
        weights: the newest sampling client; the trainer publishes, the workers read.
        ledger: the items handed out and not yet trained or dropped (the trainer's).
        gate: the groups the trainer has consumed, which the dataloader waits on.
        metrics: the run's ``metrics.jsonl``.
    """

    start_step: int
    schedule: Schedule
    weights: LatestWeights
    ledger: DataLedger
    gate: ConsumptionGate
    metrics: MetricsLog


@dataclass(frozen=True)
class RolloutSettings:
    """What a rollout worker needs to sample a group and turn it into training data."""

    seed: int
    sampling_params: ParamsPerCall
    error_strategy: ErrorStrategy
    loss_fn: str
    max_workers: int | None = None
    """The most rollout workers at once (None: as many as items in flight)."""
    reference: SamplingClient | None = None
    """The KL penalty's reference model, when there is one."""


@dataclass(frozen=True)
class TrainerSettings:
    """What the trainer needs besides its collaborators."""

    groups_per_step: int
    max_steps: int | None
    save_every: int
    save_on_cancel: bool
    cancel_save_timeout: float
    planned_steps: int | None = None
    """The steps the run expects in all (for ``progress/done_frac``), when known."""
    learning_rate: float | None = None
    """Written as ``optim/lr`` when the backend's optimizer reports none, as the cookbook always writes it."""
    start_counts: RunCounts = field(default_factory=RunCounts)
    """Group and token counts before this run (from the checkpoint resumed), which this run continues."""
    inflight_weights: bool = False
    """Whether the weights are published in flight (token lags are then a bound where the backend does not say)."""


@dataclass(frozen=True)
class Evaluation:
    """The evaluators, how often they run (every ``every``-th step and the final weights), and their time limit."""

    evaluators: tuple[SamplingClientEvaluator, ...]
    every: int
    timeout: float
    owed: tuple[tuple[int, SamplingClient], ...] = ()
    """Evaluations a resumed run owes from before its checkpoint: each version and its weights."""


@dataclass(frozen=True)
class TrainerOutcome:
    """How the trainer finished."""

    final_step: int
    stopped_by_max_steps: bool
    counts: RunCounts
    cancelled_groups: int
    checkpoint: CheckpointRecord | None


async def run_pipeline(
    nursery: trio.Nursery,
    run: Run,
    *,
    items: DatasetItems,
    rollout: RolloutSettings,
    trainer: TrainerSettings,
    runner: StepRunner,
    checkpoints: CheckpointKeeper,
    evaluation: Evaluation,
) -> TrainerOutcome:
    """Open the channels, start every stage in ``nursery``, and run the trainer in this task.

    ``nursery`` is the run's own (see :func:`trio_rl.train`): a crash anywhere
    cancels every stage, and the run's error is one group of the original errors.
    """
    items_send, items_recv = trio.open_memory_channel[WorkItem](0)
    # Unbounded so that a worker never waits for the trainer to take its group;
    # admission already bounds what can pile up here.
    groups_send, groups_recv = trio.open_memory_channel[Delivery](math.inf)
    # The back edge of a cycle must never block: the trainer sends without
    # waiting, the dataloader drains.
    resample_send, resample_recv = (
        trio.open_memory_channel[WorkItem](math.inf) if run.schedule.resamples else (None, None)
    )
    evals_send, evals_recv = trio.open_memory_channel[tuple[int, SamplingClient]](EVAL_QUEUE_SIZE)
    stop_rollouts = trio.CancelScope()
    owed = OwedEvaluations()
    crashes = Crashes()
    nursery.start_soon(crashes.watch, evaluator(evaluation, evals_recv, run.metrics, owed))
    workers = WorkerPool(items_send, items_recv, groups_send, rollout, run)
    nursery.start_soon(crashes.watch, dataloader_with_workers(stop_rollouts, items, run, workers, resample_recv))
    # A crashing trainer leaves its channels open, so that no stage mistakes
    # the crash for the end of data (and raises beside it).
    with closed_unless_crashed(*(c for c in (groups_recv, evals_send, resample_send) if c is not None)):
        schedule = EvalSchedule(bool(evaluation.evaluators), evaluation.every)
        # In flight, the latest client adopts later weights while it samples: evaluations get pinned ones.
        pinned = runner.weights_to_evaluate if trainer.inflight_weights else None
        evals = EvalRequests(schedule, evals_send, run.weights, owed, pinned)
        return await Trainer(
            trainer,
            run=run,
            intake=GroupIntake(groups_recv, run, resample_send, stop_rollouts),
            runner=runner,
            checkpoints=checkpoints,
            evals=evals,
            crashes=crashes,
            owed_evaluations=evaluation.owed,
        ).run()


class Crashes:
    """Whether a stage of the run crashed, as the stages around the trainer are watched for it.

    A crash cancels the trainer as a cancel from outside does, and Trio's
    nursery cancels its own scope in both cases (a child leaving with
    ``Cancelled`` counts), so only the stages' own exits tell them apart.
    """

    def __init__(self) -> None:
        self.seen = False

    async def watch(self, stage: Coroutine[Any, Any, None]) -> None:
        """Run ``stage``, noting whether it ended in an error (rather than a cancellation)."""
        try:
            await stage
        except BaseException as exc:
            if _has_error(exc):
                # Set before the error reaches the nursery, so before the trainer is cancelled.
                self.seen = True
            raise


def _has_error(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_has_error(e) for e in exc.exceptions)
    return isinstance(exc, Exception)


# ---------------------------------------------------------------- dataloader


async def dataloader_with_workers(
    stop: trio.CancelScope,
    items: DatasetItems,
    run: Run,
    workers: WorkerPool,
    resampled: trio.MemoryReceiveChannel[WorkItem] | None,
) -> None:
    """The dataloader and the workers it starts, in a nursery the trainer cancels through ``stop``."""
    with stop:
        async with trio.open_nursery() as nursery:
            workers.start_in(nursery)
            await dataloader(items, run, workers, resampled)


async def dataloader(
    items: DatasetItems,
    run: Run,
    workers: WorkerPool,
    resampled: trio.MemoryReceiveChannel[WorkItem] | None,
) -> None:
    """Hand out the run's items in order, each once its schedule admits it; resampled items first.

    Closes the items channel when the data runs out, which is how the end of
    data reaches the workers and then the trainer. Items sent back while fresh
    data remained are handed out again; the back channel is then closed, so
    that later resamples fail fast and are counted as drops by the trainer.
    """
    notes, gate = run.ledger.notes, run.gate
    with (
        workers.closed_unless_crashed(),
        closed_unless_crashed(notes),
        resampled if resampled is not None else nullcontext(),
    ):
        for entry in items:
            if isinstance(entry, ItemKey):
                notes.send_nowait(Handout(None, entry))
                continue
            admission = run.schedule.admit(entry.position, run.start_step)
            while True:
                if again := ready(resampled):
                    for item in again:
                        await workers.hand_out(item)
                    continue
                if gate.consumed >= admission.consumed_before:
                    break
                # No checkpoint since the checks: a resample or consumption from
                # here on wakes this wait.
                await gate.wait_for_change()
            notes.send_nowait(Handout(entry.key, entry.next_cursor))
            await workers.hand_out(entry.item(admission))
        # Take what was resampled while data remained and close the back channel
        # in the same step (no checkpoint between), so nothing sent back is
        # ever left unread in its buffer.
        last = ready(resampled)
        if resampled is not None:
            resampled.close()
        for item in last:
            await workers.hand_out(item)


class WorkerPool:
    """Rollout workers, started only when an item finds no idle worker.

    So a run has as many workers as it has items in flight at once, however
    large its staleness limit: admission bounds the items, the items bound the
    workers. The dataloader owns the pool and closes it when it is done.
    """

    def __init__(
        self,
        items_send: trio.MemorySendChannel[WorkItem],
        items_recv: trio.MemoryReceiveChannel[WorkItem],
        groups_send: trio.MemorySendChannel[Delivery],
        settings: RolloutSettings,
        run: Run,
    ) -> None:
        self._items_send = items_send
        self._items_recv = items_recv
        self._groups_send = groups_send
        self._settings = settings
        self._schedule = run.schedule
        self._weights = run.weights
        self._max = math.inf if settings.max_workers is None else settings.max_workers
        self._nursery: trio.Nursery | None = None
        self._started = 0

    def start_in(self, nursery: trio.Nursery) -> None:
        """Start workers in ``nursery`` from now on."""
        self._nursery = nursery

    async def hand_out(self, item: WorkItem) -> None:
        """Give ``item`` to an idle worker, starting one if none is idle and the limit allows."""
        try:
            self._items_send.send_nowait(item)
            return
        except trio.WouldBlock:
            pass
        if self._started < self._max:
            assert self._nursery is not None, "start_in() before hand_out()"
            self._started += 1
            self._nursery.start_soon(
                rollout_worker,
                self._items_recv.clone(),
                self._groups_send.clone(),
                self._settings,
                self._schedule,
                self._weights,
            )
        await send_downstream(self._items_send, item)

    def closed_unless_crashed(self) -> AbstractContextManager[None]:
        """Close the pool's channel ends (the workers hold clones of them) when the dataloader is done."""
        return closed_unless_crashed(self._items_send, self._items_recv, self._groups_send)


# ---------------------------------------------------------------- rollout workers


async def rollout_worker(
    items: trio.MemoryReceiveChannel[WorkItem],
    groups: trio.MemorySendChannel[Delivery],
    settings: RolloutSettings,
    schedule: Schedule,
    weights: LatestWeights,
) -> None:
    """Sample groups until the items run out, closing its clone of ``groups`` on exit."""
    with closed_unless_crashed(items, groups):
        async for item in items:
            await send_downstream(groups, await run_work_item(item, settings, schedule, weights))


async def run_work_item(
    item: WorkItem, settings: RolloutSettings, schedule: Schedule, weights: LatestWeights
) -> Delivery:
    """Roll out one item; a group that fails under a tolerant strategy becomes a :class:`SkippedGroup`.

    Under ``FailFast`` (which catches nothing) the failure propagates and ends
    the run. Building the training data is not part of the rollout: its
    errors always propagate.
    """
    try:
        rolled = await _roll_out(item, settings, schedule, weights)
    except Exception as failure:
        if not settings.error_strategy.catches_group_errors or stops_the_run(failure):
            raise
        return SkippedGroup(item, failure, list(getattr(failure, "errors", [])))
    if isinstance(rolled, AbandonedGroup):
        return rolled
    version, group = rolled
    summary = GroupSummary.of(group)
    # Outside the try: a non-finite reward ends the run under every strategy.
    _check_finite_rewards(item, version, summary.total_rewards)
    # Advantages are centred within the group, so its data can be built here,
    # while other groups are still sampling, instead of on the trainer's path.
    data = assemble_training_data([group], settings.loss_fn)
    # Scored here, beside the other groups' sampling, so the trainer only adds.
    diffs = None if settings.reference is None else await reference_logprob_diffs(settings.reference, data)
    # From here on the group is its data and a summary: its trajectories are
    # dropped rather than held (and walked by the collector) until its step.
    return FinishedGroup(item, version, summary, list(item.builder.logging_tags()), data, diffs, trio.current_time())


async def _roll_out(
    item: WorkItem, settings: RolloutSettings, schedule: Schedule, weights: LatestWeights
) -> tuple[int, TrajectoryGroup] | AbandonedGroup:
    """Make the envs, wait for fresh-enough weights, roll out the group."""
    # Envs are made before waiting for weights, so the group is ready to sample
    # the moment the trainer publishes.
    async with group_envs(item.builder) as envs:
        await weights.wait_for(item.min_version)
        if not schedule.samples_exact_version:
            # Which weights a rollout uses must not depend on which of the tasks
            # due at this instant (the trainer publishing among them) ran first.
            await settle()
        version, client = weights.latest()
        identity = (settings.seed, item.key.batch, item.key.group, item.attempt)

        def policy_for(env_index: int, attempt: int) -> TokenPolicy:
            return SamplingPolicy(client, settings.sampling_params, derive_seed(*identity, env_index, attempt))

        group: TrajectoryGroup | None = None
        with _given_up_when_stale(schedule, weights, version):
            group = await rollout_group(item.builder, envs, policy_for, settings.error_strategy)
    if group is None:  # given up as stale
        return AbandonedGroup(item, version)
    return version, group


def _given_up_when_stale(schedule: Schedule, weights: LatestWeights, version: int) -> AbstractContextManager[object]:
    """A scope that the weights cancel once a rollout from ``version`` is too stale to train on.

    Where the schedule never gives up a rollout, no scope is entered (thousands
    of waiting rollouts would each hold one).
    """
    expiry = schedule.gives_up_at(version)
    if expiry is None:
        return nullcontext()
    stale = trio.CancelScope()
    weights.cancel_at(expiry, stale)
    return stale


def _check_finite_rewards(item: WorkItem, version: int, rewards: Sequence[float]) -> None:
    bad = [(i, r) for i, r in enumerate(rewards) if not math.isfinite(r)]
    if bad:
        index, reward = bad[0]
        raise NonFiniteError(
            f"group {item.key.group} of dataset batch {item.key.batch} (sampled from the weights of step {version}) "
            f"has a non-finite total reward {reward} for trajectory {index}; nothing was trained on it"
        )


# ---------------------------------------------------------------- trainer


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
    once every task due then has run (:func:`~trio_rl.loop.determinism.settle`),
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
            self._gate.free([delivery.item])
        elif verdict is Verdict.RESAMPLE:
            self._sent_back.append(delivery.item)
        elif verdict is Verdict.FILTER:
            assert isinstance(delivery, FinishedGroup), "only a finished group has rewards to filter on"
            self._filtered.append(delivery)
            self._ledger.retire([delivery.item.key])
            self._gate.free([delivery.item])

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
        # A resampled item is handed out again ahead of fresh ones and needs no
        # slot: its first hand-out's slot is freed now, and its copies free none.
        self._gate.free(items)


class Trainer:
    """Trains the schedule's steps, records each, checkpoints, and asks for evaluations."""

    def __init__(
        self,
        settings: TrainerSettings,
        *,
        run: Run,
        intake: GroupIntake,
        runner: StepRunner,
        checkpoints: CheckpointKeeper,
        evals: EvalRequests,
        crashes: Crashes,
        owed_evaluations: Sequence[tuple[int, SamplingClient]] = (),
    ) -> None:
        self._settings = settings
        self._crashes = crashes
        self._owed_evaluations = owed_evaluations
        self._run = run
        self._intake = intake
        self._runner = runner
        self._checkpoints = checkpoints
        self._evals = evals
        self.step = run.start_step
        self.counts = settings.start_counts
        self._started = time.perf_counter()

    async def run(self) -> TrainerOutcome:
        """Train until the data runs out or ``max_steps``, then evaluate and save the final weights."""
        try:
            for version, client in self._owed_evaluations:
                await self._evals.request(version, client)
            await self._evals.request_if_due(self.step)
            stopped = await self._train_steps()
            # At max_steps the rollouts still running are of no use.
            await self._intake.stop()
            return await self._finish(stopped)
        except trio.Cancelled:
            # A crash is no end of data: nothing is saved after it.
            crashed = self._crashes.seen
            if self._settings.save_on_cancel and self._checkpoints.final is None and not crashed:
                with trio.move_on_after(self._settings.cancel_save_timeout, shield=True):
                    interrupted = await self._runner.finish_interrupted(self._summarize)
                    if interrupted is not None:
                        self._record(interrupted)
                    # Groups skipped, filtered or dropped since the last record are
                    # retired from the ledger: the row must count them.
                    self.counts = self._tally(self.counts)
                    await self._save(final=True, reason="cancelled")
            raise

    async def _train_steps(self) -> bool:
        """Whether ``max_steps`` (rather than the end of data) stopped training."""
        max_steps = self._settings.max_steps
        # Counted from the start of training, so a resumed run stops where the
        # original one would have.
        while max_steps is None or self.step < max_steps:
            done = await self._train_step()
            if done is None:
                return False
            if max_steps is None or done.step + 1 < max_steps:
                # A later step's group skipped, filtered or resampled at this
                # instant is in this record whatever Trio's task order (past
                # max_steps nothing more is sorted: those groups are cancelled).
                await self._intake.sort_this_instant(done.step + 1)
            self._record(done)
            # Only now, with the step's weights published, may more work start:
            # it starts on those weights rather than on ones already stale.
            self._run.gate.free(g.item for g in done.taken)
            every = self._settings.save_every
            if every and self.step % every == 0:
                await self._save(final=False, reason="periodic")
            await self._evals.request_if_due(self.step)
        return True

    async def _train_step(self) -> TrainedStep | None:
        """Submit each minibatch the schedule decides as soon as it does, then publish the step's weights."""
        self._intake.expire(self.step)
        self._runner.begin(self.step)
        while (minibatch := await self._intake.next_minibatch(self.step)) is not None:
            await self._runner.submit(minibatch)
        return await self._runner.finish(self._summarize)

    async def _save(self, *, final: bool, reason: str) -> CheckpointRecord | None:
        """Save the state with the counts so far, which must already include every group retired from the ledger."""
        counts = self.counts
        return await self._checkpoints.save(
            self.step,
            final=final,
            reason=reason,
            tokens=(asdict(counts.cumulative_tokens), asdict(counts.discarded_tokens)),
            counts=counts.to_json(),
            owed_evaluations=lambda: self._evals.owed.before(self.step),
        )

    def _summarize(self, groups: list[FinishedGroup]) -> Metrics:
        return group_metrics(self.step, groups, self._settings.groups_per_step)

    def _tally(self, counts: RunCounts, filtered: Sequence[FinishedGroup] = ()) -> RunCounts:
        """``counts`` with every group fate counted since: the intake's and the ledger's, and ``filtered`` (a step's own)."""
        intake, start = self._intake, self._settings.start_counts
        filtered = [*filtered, *intake.take_filtered()]
        discarded = rollout_tokens(filtered)
        # The intake and the ledger count this run's groups; a resumed run adds them to the checkpoint's.
        return replace(
            counts,
            requeued=start.requeued + intake.requeued,
            dropped_stale=start.dropped_stale + intake.dropped_stale,
            groups_skipped=start.groups_skipped + intake.groups_skipped,
            empty_batches=start.empty_batches + self._run.ledger.empty_batches,
            filtered_groups=counts.filtered_groups + len(filtered),
            cumulative_tokens=counts.cumulative_tokens + discarded,
            discarded_tokens=counts.discarded_tokens + discarded,
        )

    def _record(self, done: TrainedStep) -> None:
        ledger = self._run.ledger
        # Counted before the step's own groups are retired: they were in flight until now.
        in_flight = len(ledger.outstanding)
        ledger.retire(g.item.key for g in done.taken)
        c = self.counts
        trained_ids = {id(g) for g in done.trained}
        tokens = step_tokens(done.trained, done.submitted)
        self.counts = self._tally(
            replace(
                c,
                trained_groups=c.trained_groups + len(done.trained),
                in_flight_max=max(c.in_flight_max, in_flight),
                error_types=c.with_errors_of(done.taken),
                cumulative_tokens=c.cumulative_tokens + tokens,
            ),
            filtered=[g for g in done.taken if id(g) not in trained_ids],
        )
        settings = self._settings
        metrics = trained_step_metrics(done, self.counts, tokens, settings.planned_steps, settings.inflight_weights)
        if not math.isfinite(metrics["train/loss:sum"]):
            # Checked before anything is recorded or saved: the state is unusable.
            raise NonFiniteError(f"step {done.step}: the loss is {metrics['train/loss:sum']}; the run stops unsaved")
        if self._settings.learning_rate is not None:
            metrics.setdefault("optim/lr", self._settings.learning_rate)
        metrics["time/total"] = time.perf_counter() - self._started
        self.step = done.step + 1
        self._run.metrics.write(done.step, metrics)

    async def _finish(self, stopped: bool) -> TrainerOutcome:
        self._run.ledger.read_notes()
        counts = self.counts = self._tally(self.counts)
        cancelled = len(self._run.ledger.outstanding)
        # The final weights get a record of their own: where the data went.
        self._run.metrics.write(self.step, final_record(self.step, stopped, counts, cancelled))
        await self._evals.request_if_due(self.step, final=True)
        self._evals.close()
        checkpoint = await self._save(final=True, reason="final")
        return TrainerOutcome(self.step, stopped, counts, cancelled, checkpoint)


# ---------------------------------------------------------------- evaluator


async def evaluator(
    evaluation: Evaluation,
    requests: trio.MemoryReceiveChannel[tuple[int, SamplingClient]],
    metrics: MetricsLog,
    owed: OwedEvaluations,
) -> None:
    """Evaluate each weights version the trainer sends, once, logging under its step."""
    with requests:
        async for version, client in requests:
            metrics.write(version, await evaluate(evaluation.evaluators, version, client, evaluation.timeout))
            owed.done(version)
