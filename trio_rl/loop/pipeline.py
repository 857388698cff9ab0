"""The run's graph: a dataloader, rollout workers, the trainer and the evaluator, in one nursery.

::

    dataloader ──items──▶ rollout_worker × N ──groups──▶ trainer ──(step, client)──▶ evaluator
       │  ▲                                                │ │
       │  └────────── requeue (Requeue schedule only) ◀────┘ │
       └──────────────── handout notes ─────────────────────▶┘ (the data ledger)

Every arrow is a memory channel, and every channel end has one owner that
closes it. The end of data needs no bookkeeping: the dataloader closes
``items`` when the data runs out; each worker's ``async for`` then ends and its
``with`` block closes its clone of ``groups``; when the last clone closes, the
trainer sees ``EndOfChannel``, trains what it holds, and closes the
evaluator's channel. Any exception cancels the whole nursery.

What differs between modes comes from the run's :class:`~trio_rl.loop.schedules.Schedule`:
the dataloader asks it how to admit each item, and the trainer trains the
plans its planner makes. The stages below appear in the order data flows
through them: :func:`dataloader` (with its :class:`WorkerPool`),
:func:`rollout_worker`, :class:`Trainer` and :func:`evaluator`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Generator, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass, replace
from typing import Any

import trio

from ..backends.protocol import SamplingClient, TrainingClient
from ..errors import NonFiniteError, stops_the_run
from ..rl.data import assemble_training_data
from ..rl.kl import reference_logprob_diffs
from ..rl.metrics import GroupSummary, MetricsLog
from ..rl.rollouts import ErrorStrategy, ParamsPerCall, SamplingPolicy, TokenPolicy, group_envs, rollout_group
from ..rl.step_metrics import (
    RunCounts,
    TokenCounts,
    group_metrics,
    rollout_error_metrics,
    step_tokens,
    trained_step_metrics,
)
from ..types import EnvGroupBuilder, Metrics, RLDataset, TrajectoryGroup
from .checkpoints import CheckpointKeeper, CheckpointLog, CheckpointRecord
from .determinism import derive_seed, settle
from .evaluation import EvalSchedule, SamplingClientEvaluator, evaluate
from .gate import ConsumptionGate
from .ledger import DataLedger
from .schedules import GroupInbox, PlannerInputs, Position, Schedule, StepPlanner
from .step_runner import StepRunner, TrainedStep
from .weights import LatestWeights
from .work import AbandonedGroup, Delivery, FinishedGroup, Handout, ItemKey, SkippedGroup, WorkItem

EVAL_QUEUE_SIZE = 4
"""Due evaluations that may wait while the evaluator is busy before the trainer waits too."""


@dataclass(frozen=True)
class RolloutSettings:
    """What a rollout worker needs to sample a group and turn it into training data."""

    seed: int
    sampling_params: ParamsPerCall
    error_strategy: ErrorStrategy
    loss_fn: str
    staleness_limit: int
    abandon_stale: bool
    exact_version: bool
    reference: SamplingClient | None = None
    """The KL penalty's reference model, when there is one."""


@dataclass(frozen=True)
class TrainerSettings:
    """What the trainer needs besides its collaborators."""

    start_step: int
    groups_per_step: int
    max_steps: int | None
    save_every: int
    save_on_cancel: bool
    cancel_save_timeout: float
    planned_steps: int | None = None
    """The steps the run expects in all (for ``progress/done_frac``), when known."""
    learning_rate: float | None = None
    """Written as ``optim/lr`` when the backend's optimizer reports none, as the cookbook always writes it."""
    start_tokens: tuple[TokenCounts, TokenCounts] = (TokenCounts(), TokenCounts())
    """Cumulative and discarded tokens before this run (from the checkpoint resumed)."""


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
    *,
    dataset: RLDataset,
    first_batch: Sequence[EnvGroupBuilder],
    schedule: Schedule,
    rollout: RolloutSettings,
    trainer: TrainerSettings,
    runner: StepRunner,
    training_client: TrainingClient,
    weights: LatestWeights,
    metrics: MetricsLog,
    checkpoint_log: CheckpointLog,
    ledger_start: tuple[ItemKey, Sequence[ItemKey]],
    evaluators: Sequence[SamplingClientEvaluator],
    eval_every: int,
    eval_timeout: float,
    max_workers: int | None,
) -> TrainerOutcome:
    """Open the channels, start every stage in ``nursery``, and run the trainer in this task.

    ``nursery`` is the run's own (see :func:`trio_rl.train`): a crash anywhere
    cancels every stage, and the run's error is one group of the original errors.
    """
    items_send, items_recv = trio.open_memory_channel[WorkItem](0)
    # Unbounded so that a worker never waits for the trainer to take its group;
    # admission already bounds what can pile up here.
    groups_send, groups_recv = trio.open_memory_channel[Delivery](math.inf)
    notes_send, notes_recv = trio.open_memory_channel[Handout](math.inf)
    # The back edge of a cycle must never block: the trainer sends without
    # waiting, the dataloader drains.
    requeue_send, requeue_recv = trio.open_memory_channel[WorkItem](math.inf) if schedule.back_edge else (None, None)
    evals_send, evals_recv = trio.open_memory_channel[tuple[int, SamplingClient]](EVAL_QUEUE_SIZE)
    cursor, owed = ledger_start
    ledger = DataLedger(cursor, owed, notes_recv)
    gate = ConsumptionGate()
    rollouts_scope = trio.CancelScope()
    nursery.start_soon(evaluator, tuple(evaluators), evals_recv, metrics, eval_timeout)
    nursery.start_soon(
        rollouts,
        rollouts_scope,
        _DatasetItems(dataset, first_batch, cursor, owed),
        schedule,
        trainer.start_step,
        gate,
        (items_send, items_recv, groups_send),
        notes_send,
        requeue_recv,
        rollout,
        weights,
        max_workers,
    )
    inbox = GroupInbox(groups_recv)
    with groups_recv, evals_send, requeue_send if requeue_send is not None else nullcontext():
        return await Trainer(
            trainer,
            inbox=inbox,
            planner=schedule.planner(PlannerInputs(inbox, gate, ledger, requeue_send)),
            runner=runner,
            ledger=ledger,
            checkpoints=CheckpointKeeper(
                checkpoint_log,
                training_client,
                ledger,
                weights,
                shielded=trainer.save_on_cancel,
                cancel_save_timeout=trainer.cancel_save_timeout,
            ),
            gate=gate,
            evals=_EvalRequests(EvalSchedule(bool(evaluators), eval_every), evals_send, weights),
            metrics=metrics,
            stop_rollouts=rollouts_scope,
        ).run()


async def send_downstream(channel: trio.MemorySendChannel[Any], value: Any) -> None:
    """Send ``value``; if the receivers are gone, let the crash that removed them speak.

    Receivers only disappear when a stage crashed, and the crash cancels the
    nursery. A checkpoint lets that cancellation arrive, so the run reports the
    crash rather than a ``BrokenResourceError`` beside it.
    """
    try:
        await channel.send(value)
    except trio.BrokenResourceError:
        await trio.lowlevel.checkpoint()
        raise


@contextmanager
def closed_unless_crashed(*channels: trio.abc.AsyncResource) -> Generator[None, None, None]:
    """Close ``channels`` when the block ends or is cancelled, but not when it raises.

    Closing is how the end of data travels downstream. A stage that crashed has
    not reached the end of its data: its channels stay open, so the stage
    downstream waits until the crash's cancellation reaches it instead of
    mistaking the crash for the end of data (and, say, training a partial step
    and saving it as final).
    """
    try:
        yield
    except Exception:
        raise
    except BaseException:
        _close_all(channels)
        raise
    else:
        _close_all(channels)


def _close_all(channels: Sequence[trio.abc.AsyncResource]) -> None:
    for channel in channels:
        channel.close()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- dataloader


async def rollouts(
    scope: trio.CancelScope,
    items: _DatasetItems,
    schedule: Schedule,
    start_step: int,
    gate: ConsumptionGate,
    channels: tuple[
        trio.MemorySendChannel[WorkItem], trio.MemoryReceiveChannel[WorkItem], trio.MemorySendChannel[Delivery]
    ],
    notes: trio.MemorySendChannel[Handout],
    requeue: trio.MemoryReceiveChannel[WorkItem] | None,
    settings: RolloutSettings,
    weights: LatestWeights,
    max_workers: int | None,
) -> None:
    """The dataloader and the workers it starts, in a nursery the trainer cancels through ``scope``."""
    with scope:
        async with trio.open_nursery() as workers:
            pool = WorkerPool(workers, max_workers, *channels, settings, weights)
            await dataloader(items, schedule, start_step, gate, pool, notes, requeue)


@dataclass(frozen=True)
class _Fresh:
    key: ItemKey
    builder: EnvGroupBuilder
    position: Position
    next_cursor: ItemKey | None


class _DatasetItems:
    """The items a run hands out, in order: a resumed run's owed items, then the dataset from the cursor.

    Each dataset batch is built once (the first one was already built to check the configuration).
    """

    def __init__(
        self, dataset: RLDataset, first_batch: Sequence[EnvGroupBuilder], cursor: ItemKey, owed: Sequence[ItemKey]
    ) -> None:
        self._dataset = dataset
        self._cursor = cursor
        self._owed: dict[int, list[int]] = {}
        for key in sorted(owed):
            self._owed.setdefault(key.batch, []).append(key.group)
        self._cached: tuple[int, Sequence[EnvGroupBuilder]] = (0, first_batch)

    def _batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if self._cached[0] != index:
            self._cached = (index, self._dataset.get_batch(index))
        return self._cached[1]

    def __iter__(self) -> Iterator[_Fresh | ItemKey]:
        """Fresh items, and for each empty dataset batch the cursor past it."""
        cursor = self._cursor
        order = batch_number = batch_start = previous_start = 0
        batches = sorted(set(self._owed) | set(range(cursor.batch, len(self._dataset))))
        for b in batches:
            builders = self._batch(b)
            owed = self._owed.get(b, [])
            fresh = range(cursor.group if b == cursor.batch else 0, len(builders)) if b >= cursor.batch else range(0)
            groups = [(g, None) for g in owed] + [(g, _after(b, g, len(builders))) for g in fresh]
            if not groups:
                if b >= cursor.batch:
                    yield ItemKey(b + 1, 0)
                continue
            previous_start, batch_start = batch_start, order
            for g, next_cursor in groups:
                position = Position(order, batch_number, batch_start, previous_start, len(groups))
                yield _Fresh(ItemKey(b, g), builders[g], position, next_cursor)
                order += 1
            batch_number += 1


def _after(batch: int, group: int, batch_size: int) -> ItemKey:
    return ItemKey(batch, group + 1) if group + 1 < batch_size else ItemKey(batch + 1, 0)


async def dataloader(
    items: _DatasetItems,
    schedule: Schedule,
    start_step: int,
    gate: ConsumptionGate,
    pool: WorkerPool,
    notes: trio.MemorySendChannel[Handout],
    requeue: trio.MemoryReceiveChannel[WorkItem] | None,
) -> None:
    """Hand out the run's items in order, each once its schedule admits it; requeued items first.

    Closes the items channel when the data runs out, which is how the end of
    data reaches the workers and then the trainer. Items sent back while fresh
    data remained are handed out again; the back channel is then closed, so
    that later requeues fail fast and are counted as drops by the trainer.
    """

    def take_requeued() -> list[WorkItem]:
        taken: list[WorkItem] = []
        while requeue is not None:
            try:
                taken.append(requeue.receive_nowait())
            except trio.WouldBlock:
                break
        return taken

    with pool.closed_unless_crashed(), closed_unless_crashed(notes), requeue if requeue is not None else nullcontext():
        for entry in items:
            if isinstance(entry, ItemKey):
                notes.send_nowait(Handout(None, entry))
                continue
            admission = schedule.admit(entry.position, start_step)
            while True:
                if requeued := take_requeued():
                    for item in requeued:
                        await pool.hand_out(item)
                    continue
                if gate.consumed >= admission.consumed_before:
                    break
                # No checkpoint since the checks: a requeue or consumption from
                # here on wakes this wait.
                await gate.wait_for_change()
            notes.send_nowait(Handout(entry.key, entry.next_cursor))
            await pool.hand_out(
                WorkItem(
                    entry.key,
                    entry.position.order,
                    entry.builder,
                    attempt=0,
                    min_version=admission.min_version,
                    step=admission.step,
                    step_size=admission.step_size,
                )
            )
        # Take what was requeued while data remained and close the back channel
        # in the same step (no checkpoint between), so nothing sent back is
        # ever left unread in its buffer.
        last = take_requeued()
        if requeue is not None:
            requeue.close()
        for item in last:
            await pool.hand_out(item)


class WorkerPool:
    """Rollout workers, started only when an item finds no idle worker.

    So a run has as many workers as it has items in flight at once, however
    large its staleness limit: admission bounds the items, the items bound the
    workers. The dataloader owns the pool and closes it when it is done.
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        max_workers: int | None,
        items_send: trio.MemorySendChannel[WorkItem],
        items_recv: trio.MemoryReceiveChannel[WorkItem],
        groups_send: trio.MemorySendChannel[Delivery],
        settings: RolloutSettings,
        weights: LatestWeights,
    ) -> None:
        self._nursery = nursery
        self._max = math.inf if max_workers is None else max_workers
        self._items_send = items_send
        self._items_recv = items_recv
        self._groups_send = groups_send
        self._settings = settings
        self._weights = weights
        self.started = 0

    async def hand_out(self, item: WorkItem) -> None:
        """Give ``item`` to an idle worker, starting one if none is idle and the limit allows."""
        try:
            self._items_send.send_nowait(item)
            return
        except trio.WouldBlock:
            pass
        if self.started < self._max:
            self.started += 1
            self._nursery.start_soon(
                rollout_worker, self._items_recv.clone(), self._groups_send.clone(), self._settings, self._weights
            )
        await send_downstream(self._items_send, item)

    def closed_unless_crashed(self) -> AbstractContextManager[None]:
        """Close the pool's channel ends (the workers hold clones of them) when the dataloader is done."""
        return closed_unless_crashed(self._items_send, self._items_recv, self._groups_send)


# ---------------------------------------------------------------- rollouts


async def rollout_worker(
    items: trio.MemoryReceiveChannel[WorkItem],
    groups: trio.MemorySendChannel[Delivery],
    settings: RolloutSettings,
    weights: LatestWeights,
) -> None:
    """Sample groups until the items run out, closing its clone of ``groups`` on exit."""
    with closed_unless_crashed(items, groups):
        async for item in items:
            await send_downstream(groups, await run_work_item(item, settings, weights))


async def run_work_item(item: WorkItem, settings: RolloutSettings, weights: LatestWeights) -> Delivery:
    """Roll out one item; a group that fails under a tolerant strategy becomes a :class:`SkippedGroup`.

    Under ``FailFast`` (which catches nothing) the failure propagates and ends
    the run. Building the training data is not part of the rollout: its
    errors always propagate.
    """
    try:
        rolled = await _roll_out(item, settings, weights)
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
    return FinishedGroup(item, version, summary, list(item.builder.logging_tags()), data, diffs)


async def _roll_out(
    item: WorkItem, settings: RolloutSettings, weights: LatestWeights
) -> tuple[int, TrajectoryGroup] | AbandonedGroup:
    """Make the envs, wait for fresh-enough weights, roll out the group."""
    # Envs are made before waiting for weights, so the group is ready to sample
    # the moment the trainer publishes.
    async with group_envs(item.builder) as envs:
        await weights.wait_for(item.min_version)
        if not settings.exact_version:
            # Which weights a rollout uses must not depend on which of the tasks
            # due at this instant (the trainer publishing among them) ran first.
            await settle()
        version, client = weights.latest()
        identity = (settings.seed, item.key.batch, item.key.group, item.attempt)

        def policy_for(env_index: int, attempt: int) -> TokenPolicy:
            return SamplingPolicy(client, settings.sampling_params, derive_seed(*identity, env_index, attempt))

        group: TrajectoryGroup | None = None
        with _given_up_when_stale(settings, weights, version):
            group = await rollout_group(item.builder, envs, policy_for, settings.error_strategy)
    if group is None:  # given up as stale
        return AbandonedGroup(item, version)
    return version, group


def _given_up_when_stale(
    settings: RolloutSettings, weights: LatestWeights, version: int
) -> AbstractContextManager[object]:
    """A scope that the weights cancel once a rollout from ``version`` is too stale to train on.

    Without ``abandon_stale`` nothing is ever given up, and no scope is entered
    (thousands of waiting rollouts would each hold one).
    """
    if not settings.abandon_stale:
        return nullcontext()
    stale = trio.CancelScope()
    weights.cancel_at(version + settings.staleness_limit + 1, stale)
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


class _EvalRequests:
    """The trainer's side of the evaluator channel."""

    def __init__(
        self, schedule: EvalSchedule, send: trio.MemorySendChannel[tuple[int, SamplingClient]], weights: LatestWeights
    ) -> None:
        self._schedule = schedule
        self._send = send
        self._weights = weights

    async def request_if_due(self, version: int, *, final: bool = False) -> None:
        if self._schedule.due(version, final=final):
            await send_downstream(self._send, (version, self._weights.latest()[1]))

    def close(self) -> None:
        self._send.close()


class Trainer:
    """Trains the planner's steps, records each, checkpoints, and asks for evaluations."""

    def __init__(
        self,
        settings: TrainerSettings,
        *,
        inbox: GroupInbox,
        planner: StepPlanner,
        runner: StepRunner,
        ledger: DataLedger,
        checkpoints: CheckpointKeeper,
        gate: ConsumptionGate,
        evals: _EvalRequests,
        metrics: MetricsLog,
        stop_rollouts: trio.CancelScope,
    ) -> None:
        self._settings = settings
        self._inbox = inbox
        self._planner = planner
        self._runner = runner
        self._ledger = ledger
        self._checkpoints = checkpoints
        self._gate = gate
        self._evals = evals
        self._metrics = metrics
        self._stop_rollouts = stop_rollouts
        self.step = settings.start_step
        self.counts = RunCounts(cumulative_tokens=settings.start_tokens[0], discarded_tokens=settings.start_tokens[1])
        self._started = time.perf_counter()

    async def run(self) -> TrainerOutcome:
        """Train until the data runs out or ``max_steps``, then evaluate and save the final weights."""
        try:
            await self._evals.request_if_due(self.step)
            stopped = await self._train_steps()
            # At max_steps the rollouts still running are of no use.
            self._stop_rollouts.cancel()
            while await self._inbox.receive() is not None:
                pass  # discarded: those items stay owed, and a resume samples them
            return await self._finish(stopped)
        except trio.Cancelled:
            if self._settings.save_on_cancel and self._checkpoints.final is None:
                with trio.move_on_after(self._settings.cancel_save_timeout, shield=True):
                    interrupted = await self._runner.finish_interrupted(self._summarize)
                    if interrupted is not None:
                        self._record(interrupted)
                    await self._checkpoints.save(self.step, final=True, reason="cancelled", tokens=self._tokens())
            raise

    async def _train_steps(self) -> bool:
        """Whether ``max_steps`` (rather than the end of data) stopped training."""
        max_steps = self._settings.max_steps
        # Counted from the start of training, so a resumed run stops where the
        # original one would have.
        while max_steps is None or self.step < max_steps:
            plan = await self._planner.next_step(self.step)
            done = None if plan is None else await self._runner.run(self.step, plan, self._summarize)
            if done is None:
                return False
            self._record(done)
            # Only now, with the step's weights published, may more work start:
            # it starts on those weights rather than on ones already stale.
            self._gate.consume(len(done.taken))
            every = self._settings.save_every
            if every and self.step % every == 0:
                await self._checkpoints.save(self.step, final=False, reason="periodic", tokens=self._tokens())
            await self._evals.request_if_due(self.step)
        return True

    def _tokens(self) -> tuple[dict[str, int], dict[str, int]]:
        return asdict(self.counts.cumulative_tokens), asdict(self.counts.discarded_tokens)

    def _summarize(self, groups: list[FinishedGroup]) -> Metrics:
        return group_metrics(self.step, groups, self._settings.groups_per_step)

    def _record(self, done: TrainedStep) -> None:
        self._ledger.retire(g.item.key for g in done.taken)
        c = self.counts
        trained_ids = {id(g) for g in done.trained}
        tokens, discarded = step_tokens(
            done.trained, [g for g in done.taken if id(g) not in trained_ids], done.submitted
        )
        self.counts = RunCounts(
            trained_groups=c.trained_groups + len(done.trained),
            filtered_groups=c.filtered_groups + len(done.taken) - len(done.trained),
            requeued=self._planner.requeued,
            dropped_stale=self._planner.dropped_stale,
            in_flight_max=max(c.in_flight_max, len(self._ledger.outstanding)),
            empty_batches=self._ledger.empty_batches,
            groups_skipped=self._planner.groups_skipped,
            error_types=c.with_errors_of(done.taken),
            cumulative_tokens=c.cumulative_tokens + tokens + discarded,
            discarded_tokens=c.discarded_tokens + discarded,
        )
        metrics = trained_step_metrics(done, self.counts, tokens, self._settings.planned_steps)
        if not math.isfinite(metrics["train/loss:sum"]):
            # Checked before anything is recorded or saved: the state is unusable.
            raise NonFiniteError(f"step {done.step}: the loss is {metrics['train/loss:sum']}; the run stops unsaved")
        if self._settings.learning_rate is not None:
            metrics.setdefault("optim/lr", self._settings.learning_rate)
        metrics["time/total"] = time.perf_counter() - self._started
        self.step = done.step + 1
        self._metrics.write(done.step, metrics)

    async def _finish(self, stopped: bool) -> TrainerOutcome:
        self._ledger.read_notes()
        counts = self.counts = replace(
            self.counts,
            requeued=self._planner.requeued,
            dropped_stale=self._planner.dropped_stale,
            empty_batches=self._ledger.empty_batches,
            groups_skipped=self._planner.groups_skipped,
        )
        cancelled = len(self._ledger.outstanding)
        # The final weights get a record of their own: where the data went.
        self._metrics.write(
            self.step,
            {
                "run/final_step": self.step,
                "run/stopped_by_max_steps": int(stopped),
                "run/trained_groups": counts.trained_groups,
                "run/dropped_stale": counts.dropped_stale,
                "run/requeued": counts.requeued,
                "run/cancelled_groups": cancelled,
                "run/filtered_constant": counts.filtered_groups,
                "run/empty_batches": counts.empty_batches,
                "run/groups_skipped": counts.groups_skipped,
                **rollout_error_metrics(counts),
            },
        )
        await self._evals.request_if_due(self.step, final=True)
        self._evals.close()
        checkpoint = await self._checkpoints.save(self.step, final=True, reason="final", tokens=self._tokens())
        return TrainerOutcome(self.step, stopped, counts, cancelled, checkpoint)


# ---------------------------------------------------------------- evaluator


async def evaluator(
    evaluators: tuple[SamplingClientEvaluator, ...],
    requests: trio.MemoryReceiveChannel[tuple[int, SamplingClient]],
    metrics: MetricsLog,
    timeout: float,
) -> None:
    """Evaluate each weights version the trainer sends, once, logging under its step."""
    with requests:
        async for version, client in requests:
            metrics.write(version, await evaluate(evaluators, version, client, timeout))
