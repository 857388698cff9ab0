"""Resampling: the back edge, dropping after the end of data, giving up stale rollouts, patience."""

from __future__ import annotations

import math

import pytest
import trio
from trio.testing import MockClock

from trio_rl.loop.gate import ConsumptionGate
from trio_rl.loop.ledger import DataLedger
from trio_rl.loop.oldest_first import OldestFirst
from trio_rl.loop.resampling import NoResampling, Resampling, resampling_for
from trio_rl.loop.schedules import Requeue
from trio_rl.loop.weights import LatestWeights
from trio_rl.loop.work import ItemKey, WorkItem
from trio_rl.testing import FakeEnvGroupBuilder, FakeEnvSpec


def _item(group: int, attempt: int = 0) -> WorkItem:
    builder = FakeEnvGroupBuilder((0, group), FakeEnvSpec(), [])
    return WorkItem(ItemKey(0, group), group, builder, attempt=attempt, min_version=0, step=None, step_size=None)


def _resampling(keys: list[ItemKey], k: int = 1) -> tuple[Resampling, DataLedger, ConsumptionGate]:
    ledger, gate = DataLedger(ItemKey(1, 0), keys), ConsumptionGate()
    return Resampling(Requeue(2, 1, k), ledger, gate), ledger, gate


def test_items_resampled_while_data_remains_reach_the_dataloader_in_dataset_order_as_a_new_attempt() -> None:
    resampling, _, gate = _resampling([ItemKey(0, 0), ItemKey(0, 1)])
    resampling.add(_item(1))
    resampling.add(_item(0, attempt=2))
    assert resampling.pending and resampling.take_ready() == []  # nothing leaves before the instant ends
    resampling.end_instant()
    handed = resampling.take_ready()
    assert [(i.key.group, i.attempt) for i in handed] == [(0, 3), (1, 1)]
    # Only the first hand-out (attempt 0) held an admission slot; the copy at attempt 2 frees none.
    assert (resampling.resampled, resampling.dropped, gate.consumed) == (2, 0, 1)
    assert not resampling.pending


def test_an_item_resampled_after_the_back_edge_closed_is_dropped_counted_and_retired() -> None:
    resampling, ledger, gate = _resampling([ItemKey(0, 0), ItemKey(0, 1)])
    resampling.add(_item(0))
    resampling.end_instant()
    # The data runs out: what was resampled is taken and the back edge closed in one step.
    assert [i.key.group for i in resampling.take_last()] == [0]
    resampling.add(_item(1))
    resampling.end_instant()
    assert (resampling.resampled, resampling.dropped, gate.consumed) == (1, 1, 2)
    assert ledger.outstanding == [ItemKey(0, 0)]


async def test_a_stale_rollout_is_given_up_when_the_version_that_makes_it_stale_is_published() -> None:
    resampling, _, _ = _resampling([], k=1)
    weights = LatestWeights(on_publish=resampling.published)
    weights.publish(0, object())  # type: ignore[arg-type]
    scope = resampling.given_up_when_stale(latest=0, version=0)
    assert isinstance(scope, trio.CancelScope)
    weights.publish(1, object())  # type: ignore[arg-type]
    assert not scope.cancel_called  # one step stale: K allows it
    weights.publish(2, object())  # type: ignore[arg-type]
    assert scope.cancel_called


async def test_giving_up_cancels_every_rollout_running_and_every_later_one() -> None:
    resampling, _, _ = _resampling([], k=3)
    running = resampling.given_up_when_stale(latest=0, version=0)
    resampling.give_up_all()
    later = resampling.given_up_when_stale(latest=1, version=1)
    assert isinstance(running, trio.CancelScope) and running.cancel_called
    assert isinstance(later, trio.CancelScope) and later.cancel_called


def test_a_run_that_does_not_resample_has_no_resampling_and_enters_no_scope() -> None:
    ledger, gate = DataLedger(ItemKey(0, 0), []), ConsumptionGate()
    assert isinstance(resampling_for(Requeue(2, 1, 1), ledger, gate), Resampling)
    none = resampling_for(OldestFirst(2, 1, 1), ledger, gate)
    assert isinstance(none, NoResampling)
    assert not isinstance(none.given_up_when_stale(latest=0, version=0), trio.CancelScope)
    assert none.patience(3) == math.inf and not none.settles_before_waiting
    with pytest.raises(AssertionError, match="resamples"):
        none.add(object())  # type: ignore[arg-type]


async def test_weights_tell_on_publish_each_version_they_publish() -> None:
    seen: list[int] = []
    weights = LatestWeights(on_publish=seen.append)
    weights.publish(0, object())  # type: ignore[arg-type]
    weights.advance(1)
    assert seen == [0, 1]


async def test_patience_waits_without_limit_until_the_data_ends_then_k_plus_one_mean_steps(
    autojump_clock: MockClock,
) -> None:
    resampling, ledger, _ = _resampling([], k=1)
    with trio.fail_after(60):
        start = trio.current_time()
        resampling.step_begins(0)
        await trio.sleep(3.0)
        resampling.step_begins(1)
        await trio.sleep(3.0)
        resampling.step_begins(2)
        assert resampling.settles_before_waiting  # the end of data is not seen yet
        resampling.end_instant()
        assert resampling.patience(2) == math.inf
        ledger.notes.close()  # the dataloader is done
        await trio.sleep(1.0)
        resampling.end_instant()
        assert not resampling.settles_before_waiting
        # Two steps of 3 s on average; the data ended 1 s into step 2: (K + 1) * 3 s from then.
        assert resampling.patience(2) == start + 7.0 + 2 * 3.0
        resampling.give_up_all()
        assert resampling.patience(2) == math.inf
