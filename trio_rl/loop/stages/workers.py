"""The rollout workers: the pool the dataloader hands items to, and what one worker does with an item."""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

import trio
from tinker import types as tinker_types

from ...backends.protocol import SamplingClient
from ...base.determinism import derive_seed, settle
from ...errors import NonFiniteError, stops_the_run
from ...observe.spans import activity, current_watch, on_track, span
from ...observe.transcripts import GroupTranscript
from ...rl.data import assemble_training_data, compute_advantages, trajectory_to_data
from ...rl.kl import reference_logprob_diffs
from ...rl.rollouts import ErrorStrategy, ParamsPerCall, SamplingPolicy, TokenPolicy, group_envs, rollout_group
from ...rl.summary import GroupSummary
from ...rl.termination import TerminationRewardPolicy
from ...types import TrajectoryGroup
from ..channels import closed_unless_crashed, send_downstream
from ..work import AbandonedGroup, Delivery, FinishedGroup, SkippedGroup, WorkItem
from .run import Run


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
    termination: TerminationRewardPolicy | None = None
    """How a reward depends on the stop reason (``Config.termination``)."""


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
        self._run = run
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
                self._run,
                self._started - 1,
            )
        await send_downstream(self._items_send, item)

    def closed_unless_crashed(self) -> AbstractContextManager[None]:
        """Close the pool's channel ends (the workers hold clones of them) when the dataloader is done."""
        return closed_unless_crashed(self._items_send, self._items_recv, self._groups_send)


async def rollout_worker(
    items: trio.MemoryReceiveChannel[WorkItem],
    groups: trio.MemorySendChannel[Delivery],
    settings: RolloutSettings,
    run: Run,
    number: int = 0,
) -> None:
    """Sample groups until the items run out, closing its clone of ``groups`` on exit; its spans go on ``worker <number>``."""
    with closed_unless_crashed(items, groups), on_track(f"worker {number}"):
        async for item in items:
            key = item.key
            with activity(f"group {key.batch}/{key.group}", attempt=item.attempt):
                with span("trajectory_group_worker", batch=key.batch, group=key.group, attempt=item.attempt):
                    delivery = await run_work_item(item, settings, run)
                await send_downstream(groups, delivery)


async def run_work_item(item: WorkItem, settings: RolloutSettings, run: Run) -> Delivery:
    """Roll out one item; a group that fails under a tolerant strategy becomes a :class:`SkippedGroup`.

    Under ``FailFast`` (which catches nothing) the failure propagates and ends
    the run. Building the training data is not part of the rollout: its
    errors always propagate.
    """
    try:
        rolled = await _roll_out(item, settings, run)
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
    watch = current_watch()
    transcript = None
    with span("assemble_training_data"):
        if watch is not None and watch.transcripts:
            transcript, data = _with_transcript(item, version, group, settings.loss_fn)
        else:
            data = assemble_training_data([group], settings.loss_fn)
    # Scored here, beside the other groups' sampling, so the trainer only adds.
    diffs = None if settings.reference is None else await reference_logprob_diffs(settings.reference, data)
    # From here on the group is its data and a summary: its trajectories are
    # dropped rather than held (and walked by the collector) until its step.
    tags = list(item.builder.logging_tags())
    return FinishedGroup(item, version, summary, tags, data, diffs, trio.current_time(), transcript)


def _with_transcript(
    item: WorkItem, version: int, group: TrajectoryGroup, loss_fn: str
) -> tuple[GroupTranscript, list[tinker_types.Datum]]:
    """The group's transcript and training data, built per trajectory so the transcript holds each one's Datums."""
    (advantages,) = compute_advantages([group])
    per_trajectory = [trajectory_to_data(t, a, loss_fn) for t, a in zip(group.trajectories_G, advantages, strict=True)]
    key = (item.key.batch, item.key.group, item.attempt)
    tags = list(item.builder.logging_tags())
    transcript = GroupTranscript.of(key, version, group, advantages, per_trajectory, tags)
    return transcript, [datum for data in per_trajectory for datum in data]


async def _roll_out(
    item: WorkItem, settings: RolloutSettings, run: Run
) -> tuple[int, TrajectoryGroup] | AbandonedGroup:
    """Make the envs, wait for fresh-enough weights, roll out the group."""
    weights = run.weights
    # Envs are made before waiting for weights, so the group is ready to sample
    # the moment the trainer publishes.
    async with group_envs(item.builder) as envs:
        with span("wait_for_weights", min_version=item.min_version):
            await weights.wait_for(item.min_version)
        if not run.schedule.samples_exact_version:
            # Which weights a rollout uses must not depend on which of the tasks
            # due at this instant (the trainer publishing among them) ran first.
            await settle()
        version, client = weights.latest()
        identity = (settings.seed, item.key.batch, item.key.group, item.attempt)

        def policy_for(env_index: int, attempt: int) -> TokenPolicy:
            return SamplingPolicy(client, settings.sampling_params, derive_seed(*identity, env_index, attempt))

        group: TrajectoryGroup | None = None
        with run.resampling.given_up_when_stale(weights.version, version):
            group = await rollout_group(item.builder, envs, policy_for, settings.error_strategy, settings.termination)
    if group is None:  # given up as stale
        return AbandonedGroup(item, version)
    return version, group


def _check_finite_rewards(item: WorkItem, version: int, rewards: Sequence[float]) -> None:
    bad = [(i, r) for i, r in enumerate(rewards) if not math.isfinite(r)]
    if bad:
        index, reward = bad[0]
        raise NonFiniteError(
            f"group {item.key.group} of dataset batch {item.key.batch} (sampled from the weights of step {version}) "
            f"has a non-finite total reward {reward} for trajectory {index}; nothing was trained on it"
        )
