"""The stages of a run: dataloader, rollout workers, trainer and evaluator.

They are tasks in one nursery (see :func:`trio_rl.train`), linked by memory
channels::

    dataloader ──items──▶ rollout_worker × N ──groups──▶ trainer ──(version, client)──▶ evaluator
        ▲                                                   │
        └──────────────── requeue (unbounded) ◀─────────────┘   "requeue" staleness only

Shutdown needs no bookkeeping. The dataloader closes ``items_send`` when the data
runs out; each worker's ``async for`` then ends and its ``with`` block closes its
clone of ``groups_send``; when the last clone closes, the trainer's receive
raises ``EndOfChannel``. The trainer trains what it holds and closes the
evaluator's channel. Any exception cancels the whole nursery.

Every work item carries its identity (``ItemKey``: dataset batch and group, plus
an admission index and an attempt number), from which its randomness derives,
and which orders every batch. Each mode fixes which weights an item may sample
from through ``WorkItem.min_version``:

- sync and stream: the item of dataset batch ``s`` samples from exactly version ``s``;
- async "pace": item ``n`` waits for version ``target - K``, where
  ``target = n // groups_per_batch``, and the trainer trains items in admission
  order, so staleness never exceeds K and at most ``groups_per_batch * (K + 1)``
  groups are started but not yet trained;
- async "requeue": the dataloader holds group ``n`` back until version
  ``n // groups_per_step - K`` exists (it would be stale on arrival otherwise),
  but the trainer does not wait for particular groups: it trains the oldest
  fresh ones and sends groups more than K steps stale back to the dataloader,
  which resamples them while the dataset still has data and closes the back
  channel once it has none, turning later requeues into counted drops.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import trio
from tinker import types as tinker_types

from .asyncio_bridge import call_evaluator
from .backends.protocol import PendingResult, SamplingClient, TrainingClient
from .checkpoint import Checkpoint, CheckpointLog
from .config import Config
from .data import assemble_training_data, is_constant_reward, split_evenly
from .determinism import derive_seed, settle
from .evaluation import SamplingClientEvaluator
from .metrics import MetricsLog, trajectory_metrics
from .rollouts import SamplingPolicy, TokenPolicy, group_envs, is_initial_overflow, rollout_group
from .types import EnvGroupBuilder, Metrics, RLDataset, TrajectoryGroup
from .weights import LatestWeights

EVAL_QUEUE_SIZE = 4
"""Due evaluations that may wait while the evaluator is busy before the trainer waits too."""


@dataclass(frozen=True, order=True)
class ItemKey:
    """Where a group comes from in the dataset: ``dataset.get_batch(batch)[group]``."""

    batch: int
    group: int


@dataclass(frozen=True)
class WorkItem:
    """One env group on its way to being sampled.

    Attributes:
        key: its place in the dataset.
        order: its admission index in this run; batches are sorted by it.
        builder: the env group builder.
        attempt: 0, then +1 each time "requeue" sends it back.
        min_version: the oldest weights version it may sample from.
        target_step: the step that trains it, where the mode fixes it in advance.
    """

    key: ItemKey
    order: int
    builder: EnvGroupBuilder
    attempt: int
    min_version: int
    target_step: int | None


@dataclass
class FinishedGroup:
    """A sampled group with the weights version it was sampled from."""

    item: WorkItem
    version: int
    group: TrajectoryGroup
    tags: list[str]
    data: list[tinker_types.Datum]
    """The group's training data, assembled by the worker as soon as the group is done."""


class DataLedger:
    """Which dataset items have been handed out and not yet trained or dropped.

    Only a resumed run reads it: a checkpoint records the cursor and the
    outstanding items, so that a resume neither loses nor replays them.
    """

    def __init__(self, cursor: ItemKey, outstanding: Sequence[ItemKey]) -> None:
        self.cursor = cursor
        self.initial_outstanding = list(outstanding)
        self._outstanding: dict[ItemKey, None] = {}

    def handed_out(self, key: ItemKey, next_cursor: ItemKey | None) -> None:
        self._outstanding[key] = None
        if next_cursor is not None:
            self.cursor = next_cursor

    def settled(self, key: ItemKey) -> None:
        self._outstanding.pop(key, None)

    @property
    def outstanding(self) -> list[ItemKey]:
        return sorted(self._outstanding)


@dataclass
class RunStats:
    """Counts reported in the metrics."""

    in_flight: int = 0
    in_flight_max: int = 0
    requeued: int = 0
    dropped_stale: int = 0
    trained_groups: int = 0
    filtered_groups: int = 0

    def started(self) -> None:
        self.in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self.in_flight)

    def consumed(self, n: int = 1) -> None:
        self.in_flight -= n


@dataclass
class RunContext:
    """What every stage of one run shares."""

    config: Config
    dataset: RLDataset
    training_client: TrainingClient
    weights: LatestWeights
    metrics: MetricsLog
    checkpoints: CheckpointLog
    ledger: DataLedger
    start_step: int
    evaluators: Sequence[SamplingClientEvaluator] = ()
    stats: RunStats = field(default_factory=RunStats)
    groups_per_step: int = 0

    def __post_init__(self) -> None:
        # Built once: validating a SamplingParams for every rollout showed up in profiles.
        self.sampling_params = self.config.sampling_params()

    @property
    def staleness_limit(self) -> int:
        ac = self.config.async_config
        return 0 if ac is None else ac.max_steps_off_policy


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


# ---------------------------------------------------------------- dataloader


def _dataset_items(dataset: RLDataset, ledger: DataLedger) -> Iterator[tuple[ItemKey, EnvGroupBuilder, ItemKey | None]]:
    """Outstanding items of a resumed run first, then the dataset from the cursor on."""
    cached: tuple[int, Sequence[EnvGroupBuilder]] | None = None

    def batch(index: int) -> Sequence[EnvGroupBuilder]:
        nonlocal cached
        if cached is None or cached[0] != index:
            cached = (index, dataset.get_batch(index))
        return cached[1]

    for key in ledger.initial_outstanding:
        yield key, batch(key.batch)[key.group], None
    start = ledger.cursor
    for b in range(start.batch, len(dataset)):
        builders = batch(b)
        for g in range(start.group if b == start.batch else 0, len(builders)):
            following = ItemKey(b, g + 1) if g + 1 < len(builders) else ItemKey(b + 1, 0)
            yield ItemKey(b, g), builders[g], following


def _admit(ctx: RunContext, order: int, key: ItemKey, builder: EnvGroupBuilder) -> WorkItem:
    config = ctx.config
    if config.mode in ("sync", "stream"):
        # Dataset batch s is step s; on resume the cursor sits at the start of a batch.
        return WorkItem(key, order, builder, 0, min_version=key.batch, target_step=key.batch)
    assert config.async_config is not None
    # Group n is due for step n // groups_per_step; starting it before the weights
    # of step (due - K) exist would only make it stale on arrival.
    due = ctx.start_step + order // ctx.groups_per_step
    min_version = max(ctx.start_step, due - ctx.staleness_limit)
    pace = config.async_config.staleness == "pace"
    return WorkItem(key, order, builder, 0, min_version=min_version, target_step=due if pace else None)


async def dataloader(
    ctx: RunContext,
    items_send: trio.MemorySendChannel[WorkItem],
    requeue_recv: trio.MemoryReceiveChannel[WorkItem] | None,
) -> None:
    """Hand out the dataset's groups in order, requeued groups first.

    Closes ``items_send`` when the data runs out, which is how the end of data
    reaches the workers and then the trainer. Under "requeue", groups requeued
    while fresh data remained are sampled again; the back channel is then closed,
    so that later requeues fail fast and are counted as drops by the trainer.
    """

    async def forward_requeued() -> None:
        assert requeue_recv is not None
        while True:
            try:
                item = requeue_recv.receive_nowait()
            except trio.WouldBlock:
                return
            await send_downstream(items_send, item)

    async def requeued_or_weights(version: int) -> WorkItem | None:
        """Wait for a requeued group (returned) or for weights ``version`` (None), whichever comes first."""
        assert requeue_recv is not None
        requeued: WorkItem | None = None
        async with trio.open_nursery() as race:

            async def weights_ready() -> None:
                await ctx.weights.wait_for(version)
                race.cancel_scope.cancel()

            async def group_requeued() -> None:
                nonlocal requeued
                requeued = await requeue_recv.receive()
                race.cancel_scope.cancel()

            race.start_soon(weights_ready)
            race.start_soon(group_requeued)
        return requeued

    with items_send:
        for order, (key, builder, following) in enumerate(_dataset_items(ctx.dataset, ctx.ledger)):
            item = _admit(ctx, order, key, builder)
            if requeue_recv is not None:
                await forward_requeued()
                # Hold fresh groups here rather than in a worker, so that idle
                # workers stay free to resample what the trainer requeues.
                while ctx.weights.version < item.min_version:
                    requeued = await requeued_or_weights(item.min_version)
                    if requeued is not None:
                        await send_downstream(items_send, requeued)
            await send_downstream(items_send, item)
            ctx.ledger.handed_out(key, following)
        if requeue_recv is not None:
            # Take what was requeued while data remained, and close the back
            # channel in the same step (no checkpoint in between), so nothing
            # requeued is ever left unread in its buffer.
            last_requeued: list[WorkItem] = []
            while True:
                try:
                    last_requeued.append(requeue_recv.receive_nowait())
                except trio.WouldBlock:
                    break
            requeue_recv.close()
            for item in last_requeued:
                await send_downstream(items_send, item)


# ---------------------------------------------------------------- rollouts


async def run_work_item(ctx: RunContext, item: WorkItem) -> FinishedGroup:
    """Make the envs, wait for fresh-enough weights, roll out the group."""
    config = ctx.config
    # Envs are made before waiting for weights, so the next batch is ready to
    # sample the moment the trainer publishes.
    async with group_envs(item.builder) as envs:
        await ctx.weights.wait_for(item.min_version)
        await settle()
        version, client = ctx.weights.latest()
        ctx.stats.started()
        item_seed = (config.seed, item.key.batch, item.key.group, item.attempt)

        def policy_for(env_index: int, attempt: int) -> TokenPolicy:
            return SamplingPolicy(client, ctx.sampling_params, derive_seed(*item_seed, env_index, attempt))

        group = await rollout_group(item.builder, envs, policy_for, config.error_strategy)
    # Advantages are centred within the group, so its data can be built here,
    # while other groups are still sampling, instead of on the trainer's path.
    data = assemble_training_data([group], config.loss_fn)
    return FinishedGroup(item, version, group, list(item.builder.logging_tags()), data)


async def rollout_worker(
    ctx: RunContext,
    items_recv: trio.MemoryReceiveChannel[WorkItem],
    groups_send: trio.MemorySendChannel[FinishedGroup],
) -> None:
    """Sample groups until the items run out; closing its ``groups_send`` clone on exit."""
    with items_recv, groups_send:
        async for item in items_recv:
            await send_downstream(groups_send, await run_work_item(ctx, item))


# ---------------------------------------------------------------- evaluator


async def evaluator_stage(
    ctx: RunContext, evals_recv: trio.MemoryReceiveChannel[tuple[int, SamplingClient]]
) -> None:
    """Evaluate each weights version the trainer sends, once, logging under its step."""
    with evals_recv:
        async for version, client in evals_recv:
            results: Metrics = {}
            started = time.perf_counter()
            for evaluator in ctx.evaluators:
                results.update(await call_evaluator(evaluator, client))
            results["time/eval"] = time.perf_counter() - started
            ctx.metrics.record_eval(version, results)


# ---------------------------------------------------------------- trainer


@dataclass
class TrainerOutcome:
    """How the trainer finished."""

    final_step: int
    stopped_by_max_steps: bool


class Trainer:
    """Turns finished groups into training steps and publishes new weights."""

    def __init__(
        self,
        ctx: RunContext,
        groups_recv: trio.MemoryReceiveChannel[FinishedGroup],
        evals_send: trio.MemorySendChannel[tuple[int, SamplingClient]],
        requeue_send: trio.MemorySendChannel[WorkItem] | None,
    ) -> None:
        self.ctx = ctx
        self.config = ctx.config
        self.groups_recv = groups_recv
        self.evals_send = evals_send
        self.requeue_send = requeue_send
        self.step = ctx.start_step
        self.run_started = time.perf_counter()
        self._last_saved: tuple[int, str] | None = None
        self._last_evaluated: int | None = None
        self._data_ended = False
        self._grads_pending = False

    # ---- lifecycle

    async def train_steps(self) -> bool:
        """Train until the data runs out or ``max_steps``; return whether ``max_steps`` stopped it."""
        await self._maybe_evaluate(self.step)
        try:
            mode = self.config.mode
            if mode == "stream":
                return await self._run_stream()
            if mode == "async" and self.requeue_send is not None:
                return await self._run_requeue()
            return await self._run_fixed()
        except trio.Cancelled:
            if self.config.save_on_cancel:
                with trio.move_on_after(self.config.cancel_save_timeout, shield=True):
                    await self._save(final=True, reason="cancelled")
            raise

    async def finish(self, stopped: bool) -> TrainerOutcome:
        """Once the rollouts are over: record where the data went, evaluate and save the final weights."""
        if self.requeue_send is not None:
            self.requeue_send.close()
        stats = self.ctx.stats
        # The final weights get a record of their own: where the data went.
        self.ctx.metrics.record_final(
            self.step,
            {
                "run/final_step": self.step,
                "run/stopped_by_max_steps": int(stopped),
                "run/trained_groups": stats.trained_groups,
                "run/dropped_stale": stats.dropped_stale,
                "run/requeued": stats.requeued,
                "run/cancelled_groups": len(self.ctx.ledger.outstanding),
                "run/filtered_constant": stats.filtered_groups,
            },
        )
        await self._maybe_evaluate(self.step, final=True)
        await self._save(final=True, reason="final")
        return TrainerOutcome(final_step=self.step, stopped_by_max_steps=stopped)

    def _max_steps_reached(self) -> bool:
        # Counted from the start of training, so a resumed run stops where the
        # original one would have.
        return self.config.max_steps is not None and self.step >= self.config.max_steps

    # ---- modes

    async def _receive(self) -> FinishedGroup | None:
        """The next finished group, or None at the end of data."""
        try:
            return await self.groups_recv.receive()
        except trio.EndOfChannel:
            return None

    def _receive_ready(self) -> tuple[list[FinishedGroup], bool]:
        """Every group already delivered, without waiting; and whether the data has ended."""
        ready: list[FinishedGroup] = []
        while True:
            try:
                ready.append(self.groups_recv.receive_nowait())
            except trio.WouldBlock:
                return ready, False
            except trio.EndOfChannel:
                return ready, True

    def _expected_groups(self, step: int) -> int:
        if self.config.mode in ("sync", "stream"):
            # Step s is dataset batch s, whatever its size.
            return len(self.ctx.dataset.get_batch(step)) if step < len(self.ctx.dataset) else 0
        return self.ctx.groups_per_step

    async def _collect(self, by_step: dict[int, list[FinishedGroup]], count: int) -> None:
        """Receive until this step holds ``count`` groups or the data ends."""
        while not self._data_ended and len(by_step[self.step]) < count:
            group = await self._receive()
            if group is None:
                self._data_ended = True
            else:
                assert group.item.target_step is not None
                by_step[group.item.target_step].append(group)

    async def _run_fixed(self) -> bool:
        """Sync and "pace": step s trains exactly the items assigned to it."""
        by_step: dict[int, list[FinishedGroup]] = defaultdict(list)
        while not self._max_steps_reached():
            expected = self._expected_groups(self.step)
            await self._collect(by_step, expected)
            groups = by_step.pop(self.step, [])
            if not groups:
                return False
            await self._train_step(groups)
        return True

    async def _run_stream(self) -> bool:
        """Sync on-policy, with one forward_backward per minibatch as soon as it fills."""
        assert self.config.stream_minibatch_config is not None
        num_minibatches = self.config.stream_minibatch_config.num_minibatches
        per_substep = num_minibatches // self.config.num_substeps
        by_step: dict[int, list[FinishedGroup]] = defaultdict(list)
        while not self._max_steps_reached():
            started = time.perf_counter()
            expected = self._expected_groups(self.step)
            taken: list[FinishedGroup] = []
            submitted: list[PendingResult[Any]] = []
            sizes = [len(part) for part in split_evenly(range(expected), num_minibatches)]
            for index, minibatch_size in enumerate(sizes):
                await self._collect(by_step, minibatch_size)
                if not self._data_ended:
                    # Which groups fill this minibatch must not depend on which
                    # task ran first among those finishing at the same instant.
                    await settle()
                    ready, self._data_ended = self._receive_ready()
                    for group in ready:
                        assert group.item.target_step is not None
                        by_step[group.item.target_step].append(group)
                pool = sorted(by_step[self.step], key=lambda g: g.item.order)
                minibatch, by_step[self.step] = pool[:minibatch_size], pool[minibatch_size:]
                taken.extend(minibatch)
                submitted.extend(await self._submit(minibatch, optim=(index + 1) % per_substep == 0))
                if self._data_ended and not by_step[self.step]:
                    break
            # A substep cut short by the end of data still gets its optim_step.
            submitted.extend(await self._submit([], optim=True))
            del by_step[self.step]
            if not taken:
                return False
            await self._finish_step(taken, submitted, started=started)
        return True

    async def _run_requeue(self) -> bool:
        """Async "requeue": train the oldest fresh groups, send stale ones back."""
        groups_per_step = self.ctx.groups_per_step
        pool: list[FinishedGroup] = []
        ended = False
        while not self._max_steps_reached():
            while True:
                pool = self._retire_stale(pool)
                if ended or len(pool) >= groups_per_step:
                    break
                group = await self._receive()
                if group is None:
                    ended = True
                else:
                    pool.append(group)
            if not ended:
                await settle()
                ready, ended = self._receive_ready()
                pool = self._retire_stale(pool + ready)
                if len(pool) < groups_per_step and not ended:
                    continue
            pool.sort(key=lambda g: (g.version, g.item.order, g.item.attempt))
            batch, pool = pool[:groups_per_step], pool[groups_per_step:]
            if not batch:
                return False
            await self._train_step(batch)
        return True

    def _retire_stale(self, pool: list[FinishedGroup]) -> list[FinishedGroup]:
        """Requeue (or, once the data has run out, drop) groups more than K steps stale."""
        fresh: list[FinishedGroup] = []
        stale = sorted(
            (g for g in pool if self.step - g.version > self.ctx.staleness_limit), key=lambda g: g.item.order
        )
        fresh = [g for g in pool if self.step - g.version <= self.ctx.staleness_limit]
        for group in stale:
            self.ctx.stats.consumed()
            assert self.requeue_send is not None
            try:
                self.requeue_send.send_nowait(replace(group.item, attempt=group.item.attempt + 1))
                self.ctx.stats.requeued += 1
            except trio.BrokenResourceError:
                self.ctx.stats.dropped_stale += 1
                self.ctx.ledger.settled(group.item.key)
        return fresh

    # ---- one step

    async def _submit(self, groups: Sequence[FinishedGroup], *, optim: bool) -> list[PendingResult[Any]]:
        """Submit forward_backward for ``groups`` (if any data), then optim_step if asked; wait for neither."""
        pending: list[PendingResult[Any]] = []
        data = [datum for group in self._filter(groups) for datum in group.data]
        client = self.ctx.training_client
        if data:
            pending.append(await client.forward_backward(data, self.config.loss_fn, self.config.loss_fn_config))  # type: ignore[arg-type]
            self._grads_pending = True
        # An optimizer step without gradients would still move Adam's weights by
        # its momentum; a substep whose groups were all filtered out skips it.
        if optim and self._grads_pending:
            pending.append(await client.optim_step(self.config.adam_params()))
            self._grads_pending = False
        return pending

    def _filter(self, groups: Sequence[FinishedGroup]) -> list[FinishedGroup]:
        if not self.config.remove_constant_reward_groups:
            return list(groups)
        kept = [g for g in groups if not is_constant_reward(g.group)]
        self.ctx.stats.filtered_groups += len(groups) - len(kept)
        return kept

    async def _train_step(self, groups: list[FinishedGroup]) -> None:
        started = time.perf_counter()
        groups = sorted(groups, key=lambda g: (g.item.order, g.item.attempt))
        submitted: list[PendingResult[Any]] = []
        # Substeps split the groups (not the Datums) evenly, so a group's data is
        # never split across two optimizer steps.
        for chunk in split_evenly(groups, self.config.num_substeps):
            submitted.extend(await self._submit(chunk, optim=True))
        await self._finish_step(groups, submitted, started=started)

    async def _finish_step(
        self, groups: list[FinishedGroup], submitted: list[PendingResult[Any]], *, started: float
    ) -> None:
        ctx = self.ctx
        step = self.step
        # Computed while the backend works on the submitted requests.
        metrics = self._batch_metrics(groups)
        results = [await pending.result() for pending in submitted]
        train_done = time.perf_counter()
        client = await ctx.training_client.save_weights_for_sampler(f"step_{step + 1:06d}")
        ctx.weights.publish(step + 1, client)
        ctx.stats.consumed(len(groups))
        ctx.stats.trained_groups += len(groups)
        for group in groups:
            ctx.ledger.settled(group.item.key)
        metrics.update(_result_metrics(results))
        stats = ctx.stats
        metrics["progress/trained_groups"] = stats.trained_groups
        metrics["async/requeued"] = stats.requeued
        metrics["async/dropped_stale"] = stats.dropped_stale
        metrics["rollouts/in_flight_max"] = stats.in_flight_max
        metrics["data/groups_filtered_constant"] = stats.filtered_groups
        metrics["time/train"] = train_done - started
        metrics["time/total"] = time.perf_counter() - self.run_started
        self.step = step + 1
        ctx.metrics.record_train(step, metrics)
        if self.config.save_every and self.step % self.config.save_every == 0:
            await self._save(final=False, reason="periodic")
        if self.config.eval_every and self.step % self.config.eval_every == 0:
            await self._maybe_evaluate(self.step)

    def _batch_metrics(self, groups: list[FinishedGroup]) -> Metrics:
        versions = [g.version for g in groups]
        metrics: Metrics = {
            "progress/groups": len(groups),
            # Smaller than the run's batch size: the end of data, or a short dataset batch.
            "progress/partial_batch": int(len(groups) < self.ctx.groups_per_step),
            "sampling_client/step_min": min(versions),
            "sampling_client/step_max": max(versions),
            "sampling_client/step_mean": sum(versions) / len(versions),
            "sampling_client/staleness_max": self.step - min(versions),
            "rollouts/errors": sum(len(g.group.rollout_errors) for g in groups),
            "rollouts/initial_overflow": sum(is_initial_overflow(t) for g in groups for t in g.group.trajectories_G),
        }
        metrics.update(trajectory_metrics([g.group for g in groups], [g.tags for g in groups]))
        return metrics

    # ---- checkpoints and evaluation

    async def _save(self, *, final: bool, reason: str) -> None:
        name = f"step_{self.step:06d}"
        # The weights of a step saved periodically are still the final ones:
        # record that state again as final rather than save it twice.
        if self._last_saved is not None and self._last_saved[0] == self.step:
            path = self._last_saved[1]
        else:
            path = await self.ctx.training_client.save_state(name)
        ledger = self.ctx.ledger
        self.ctx.checkpoints.append(
            Checkpoint(
                name=name,
                step=self.step,
                state_path=path,
                cursor=(ledger.cursor.batch, ledger.cursor.group),
                outstanding=[(k.batch, k.group) for k in ledger.outstanding],
                final=final,
                reason=reason,
            )
        )
        self._last_saved = (self.step, path)

    async def _maybe_evaluate(self, version: int, *, final: bool = False) -> None:
        if not self.ctx.evaluators or self._last_evaluated == version:
            return
        if not final and not (self.config.eval_every and version % self.config.eval_every == 0):
            return
        self._last_evaluated = version
        self.ctx.metrics.expect_eval(version)
        await send_downstream(self.evals_send, (version, self.ctx.weights.latest()[1]))


def default_num_workers(config: Config, groups_per_step: int) -> int:
    """Enough workers that every group allowed in flight can sample at once."""
    if config.num_workers is not None:
        return config.num_workers
    k = 0 if config.async_config is None else config.async_config.max_steps_off_policy
    return max(1, groups_per_step * (k + 1))


def _loss_sum(output: tinker_types.ForwardBackwardOutput) -> float:
    if "loss:sum" in output.metrics:
        return output.metrics["loss:sum"]
    # Some Tinker-compatible servers (SkyRL) report only per-token losses.
    return sum(
        float(out["elementwise_loss"].to_numpy().sum()) for out in output.loss_fn_outputs if "elementwise_loss" in out
    )


def _result_metrics(results: Sequence[Any]) -> Metrics:
    """``train/loss:sum`` over the step's forward_backward calls and the optimizer's metrics."""
    metrics: Metrics = {}
    loss = 0.0
    for result in results:
        if isinstance(result, tinker_types.ForwardBackwardOutput):
            loss += _loss_sum(result)
        elif isinstance(result, tinker_types.OptimStepResponse) and result.metrics:
            metrics.update({f"optim/{k}": v for k, v in result.metrics.items()})
    metrics["train/loss:sum"] = loss
    return metrics
