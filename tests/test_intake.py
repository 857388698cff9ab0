"""GroupIntake on its own: each delivered group classified by the schedule, and its verdict carried out and counted."""

from __future__ import annotations

import math

import trio
from trio.testing import MockClock

from tests.work_items import finished_group, work_item
from trio_rl import OldestFirst, Pace, Requeue
from trio_rl.loop.gate import ConsumptionGate
from trio_rl.loop.ledger import DataLedger
from trio_rl.loop.metrics_log import MetricsLog
from trio_rl.loop.publishing import SnapshotWeights
from trio_rl.loop.resampling import resampling_for
from trio_rl.loop.schedules import Schedule
from trio_rl.loop.stages.intake import GroupIntake
from trio_rl.loop.stages.run import Run
from trio_rl.loop.weights import LatestWeights
from trio_rl.loop.work import Delivery, Handout, ItemKey, SkippedGroup

DEADLINE_S = 100.0
"""Virtual seconds; under autojump an intake that waits for nothing fails at once."""


class _Intake:
    """An intake over ``schedule``, its delivery channel, and the run state it writes to."""

    def __init__(self, schedule: Schedule) -> None:
        ledger, gate = DataLedger(ItemKey(0, 0), []), ConsumptionGate()
        resampling = resampling_for(schedule, ledger, gate)
        self.run = Run(0, schedule, LatestWeights(), ledger, gate, MetricsLog(None), SnapshotWeights(), resampling)
        self.deliver, groups = trio.open_memory_channel[Delivery](math.inf)
        self.stop_rollouts = trio.CancelScope()
        self.intake = GroupIntake(groups, self.run, self.stop_rollouts)

    def hand_out(self, *orders: int) -> None:
        """The dataloader's notes for these items of batch 0."""
        for order in orders:
            self.run.ledger.notes.send_nowait(Handout(ItemKey(0, order), ItemKey(0, order + 1)))


async def test_a_step_gets_its_groups_and_a_skipped_one_is_counted_retired_and_frees_its_slot(
    autojump_clock: MockClock,
) -> None:
    state = _Intake(Pace(groups_per_step=2, num_substeps=1, staleness_limit=1))
    state.hand_out(0, 1, 2)
    for delivery in (
        finished_group(work_item(2, step=0, step_size=3), 0),
        SkippedGroup(work_item(1, step=0, step_size=3), RuntimeError("env")),
        finished_group(work_item(0, step=0, step_size=3), 0),
    ):
        state.deliver.send_nowait(delivery)
    with trio.fail_after(DEADLINE_S):
        minibatch = await state.intake.next_minibatch(0)
    assert minibatch is not None and minibatch.optim_step and minibatch.skipped == 1
    assert [g.item.order for g in minibatch.groups] == [0, 2]  # admission order
    assert state.intake.groups_skipped == 1
    assert state.run.gate.consumed == 1  # the skipped group's slot; trained ones free theirs once published
    assert state.run.ledger.outstanding == [ItemKey(0, 0), ItemKey(0, 2)]


async def test_a_constant_reward_group_is_filtered_retired_and_handed_to_the_trainer_once(
    autojump_clock: MockClock,
) -> None:
    state = _Intake(OldestFirst(groups_per_step=1, num_substeps=1, staleness_limit=1, filter_constant=True))
    state.hand_out(0, 1)
    constant = finished_group(work_item(0), 0, rewards=(1.0, 1.0))
    state.deliver.send_nowait(constant)
    state.deliver.send_nowait(finished_group(work_item(1), 0))
    with trio.fail_after(DEADLINE_S):
        minibatch = await state.intake.next_minibatch(0)
    assert minibatch is not None and [g.item.order for g in minibatch.groups] == [1]
    assert state.intake.take_filtered() == [constant]
    assert state.intake.take_filtered() == []
    assert state.run.gate.consumed == 1
    assert state.run.ledger.outstanding == [ItemKey(0, 1)]


async def test_a_stale_group_is_sent_back_once_per_attempt_and_dropped_once_the_back_edge_is_closed(
    autojump_clock: MockClock,
) -> None:
    state = _Intake(Requeue(groups_per_step=1, num_substeps=1, staleness_limit=1))
    resampling = state.run.resampling
    assert resampling is not None
    state.hand_out(0, 1)
    state.deliver.send_nowait(finished_group(work_item(0), 0))  # sampled on version 0: 2 steps stale at step 2
    state.deliver.send_nowait(finished_group(work_item(1), 2))
    with trio.fail_after(DEADLINE_S):
        minibatch = await state.intake.next_minibatch(2)
    assert minibatch is not None and [g.item.order for g in minibatch.groups] == [1]
    (again,) = resampling.take_ready()  # what the dataloader hands out again
    assert (again.key, again.attempt) == (ItemKey(0, 0), 1)
    assert (state.intake.resampled, state.intake.dropped) == (1, 0)
    assert state.run.gate.consumed == 1  # handed out again ahead of fresh items, without a slot
    # The dataloader is done and closes the back edge: the next stale attempt is dropped and retired.
    assert resampling.take_last() == []
    state.deliver.send_nowait(finished_group(again, 0))
    state.deliver.send_nowait(finished_group(work_item(2), 2))
    state.hand_out(2)
    with trio.fail_after(DEADLINE_S):
        state.intake.expire(3)
        minibatch = await state.intake.next_minibatch(3)
    assert minibatch is not None and [g.item.order for g in minibatch.groups] == [2]
    assert (state.intake.resampled, state.intake.dropped) == (1, 1)
    assert ItemKey(0, 0) not in state.run.ledger.outstanding


async def test_the_end_of_the_workers_is_seen_and_the_last_partial_step_still_trained(
    autojump_clock: MockClock,
) -> None:
    state = _Intake(OldestFirst(groups_per_step=4, num_substeps=1, staleness_limit=1))
    state.hand_out(0)
    state.deliver.send_nowait(finished_group(work_item(0), 0))
    state.deliver.close()
    with trio.fail_after(DEADLINE_S):
        minibatch = await state.intake.next_minibatch(0)
        assert state.intake.ended
        assert minibatch is not None and [g.item.order for g in minibatch.groups] == [0]
        assert await state.intake.next_minibatch(1) is None


async def test_stop_cancels_the_rollouts_and_drops_what_they_still_deliver(autojump_clock: MockClock) -> None:
    state = _Intake(OldestFirst(groups_per_step=4, num_substeps=1, staleness_limit=1))
    state.hand_out(0)
    state.deliver.send_nowait(finished_group(work_item(0), 0))
    state.deliver.close()
    with trio.fail_after(DEADLINE_S):
        await state.intake.stop()
    assert state.stop_rollouts.cancel_called
    # Dropped, not trained nor retired: a resume samples it again.
    assert state.run.ledger.outstanding == [ItemKey(0, 0)]
