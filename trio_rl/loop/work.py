"""What travels between the stages of a run: work items, finished groups, and the ledger's notes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tinker import types as tinker_types

from ..rl.summary import GroupSummary
from ..types import EnvGroupBuilder, RolloutError


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
        attempt: 0, then +1 each time the "requeue" policy resamples it.
        min_version: the oldest weights version it may sample from.
        step: the training step that will train it, where the schedule fixes it in advance.
        step_size: how many groups that step trains, where the schedule fixes it.
    """

    key: ItemKey
    order: int
    builder: EnvGroupBuilder
    attempt: int
    min_version: int
    step: int | None = None
    step_size: int | None = None


@dataclass
class FinishedGroup:
    """A sampled group with the weights version it was sampled from.

    It keeps its trajectories' :class:`~trio_rl.rl.summary.GroupSummary` rather
    than the trajectories: the data it trains on is built already, and at
    thousands of groups per step, waiting trajectories were most of what the
    garbage collector had to walk.
    """

    item: WorkItem
    version: int
    summary: GroupSummary
    tags: list[str]
    data: list[tinker_types.Datum]
    """The group's training data, assembled by the worker as soon as the group is done."""
    reference_diffs: list[Any] | None = None
    """With a KL penalty: per Datum, ``(sampled - reference) * mask`` logprobs (numpy arrays)."""
    finished_at: float = 0.0
    """When its worker finished it (Trio's clock): which of a version's groups a step takes first."""


@dataclass(frozen=True)
class AbandonedGroup:
    """A rollout given up because its weights became too stale to train on (``"requeue"`` only)."""

    item: WorkItem
    version: int


@dataclass(frozen=True)
class SkippedGroup:
    """A group that failed beyond its error strategy's tolerance: skipped and counted, never trained.

    A schedule that fixes each step's groups in advance still counts it toward
    its step (the step waits for a fixed number of groups); the trainer retires
    it from the ledger and frees its admission slot at once.

    Attributes:
        item: the work item.
        error: why the group failed (a ``GroupFailedError``, or the exception
            ``make_envs``/``compute_group_rewards`` raised).
        errors: its failed rollout attempts.
    """

    item: WorkItem
    error: Exception
    errors: list[RolloutError] = field(default_factory=list[RolloutError])


Delivery = FinishedGroup | AbandonedGroup | SkippedGroup
"""What a rollout worker sends the trainer."""


@dataclass(frozen=True)
class Handout:
    """The dataloader's note that it handed out an item (or skipped an empty batch).

    Attributes:
        key: the item handed out; None when an empty dataset batch was skipped.
        next_cursor: the first dataset position not yet handed out afterwards;
            None for an outstanding item of a resumed run (the cursor does not move).
    """

    key: ItemKey | None
    next_cursor: ItemKey | None
