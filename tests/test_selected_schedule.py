"""schedule_for: each configuration's mode becomes its schedule; filtering is the schedule's verdict."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_rl import AsyncConfig, Config, StreamMinibatchConfig
from trio_rl.loop.oldest_first import OldestFirst
from trio_rl.loop.schedules import Need, Pace, Requeue, Schedule, Stream, Sync, Verdict
from trio_rl.loop.selected_schedule import schedule_for
from trio_rl.loop.work import FinishedGroup, ItemKey, WorkItem
from trio_rl.rl.summary import GroupSummary
from trio_rl.testing import FakeEnvGroupBuilder, FakeEnvSpec


def _config(**fields: object) -> Config:
    return Config(log_path=Path("unused"), **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        (_config(), Sync),
        (_config(stream_minibatch_config=StreamMinibatchConfig(4, 2)), Stream),
        (_config(async_config=AsyncConfig(1, 4)), OldestFirst),
        (_config(async_config=AsyncConfig(1, 4, "pace")), Pace),
        (_config(async_config=AsyncConfig(1, 4, "requeue")), Requeue),
    ],
)
def test_each_mode_becomes_its_own_schedule_and_only_requeue_resamples(config: Config, kind: type[Schedule]) -> None:
    schedule = schedule_for(config, dataset_batch_size=4)
    assert type(schedule) is kind
    assert schedule.groups_per_step == 4
    assert schedule.resamples is (kind is Requeue)


def test_every_schedule_is_told_whether_to_filter_constant_rewards() -> None:
    for section in ({}, {"async_config": AsyncConfig(1, 4, "requeue")}, {"async_config": AsyncConfig(1, 4)}):
        assert schedule_for(_config(remove_constant_reward_groups=True, **section), 4).filter_constant
        assert not schedule_for(_config(**section), 4).filter_constant


def _group(order: int, rewards: tuple[float, ...], step: int = 0, size: int = 2) -> FinishedGroup:
    builder = FakeEnvGroupBuilder((0, order), FakeEnvSpec(), [])
    item = WorkItem(ItemKey(0, order), order, builder, attempt=0, min_version=0, step=step, step_size=size)
    return FinishedGroup(item, 0, GroupSummary(rewards, 2, 2, 2, (), (), 0, ()), [], [])


def test_a_step_marks_its_constant_groups_filtered_and_trains_the_rest() -> None:
    pace = Pace(2, 1, 1, filter_constant=True)
    flat, varied = _group(0, (1.0, 1.0)), _group(1, (1.0, 0.0))
    assert [pace.classify(g, 0) for g in (flat, varied)] == [Verdict.KEEP, Verdict.KEEP]
    assert pace.need(0, ended=False) is Need.THIS_INSTANT
    minibatch = pace.next_minibatch(0)
    assert minibatch is not None
    assert minibatch.groups == [flat, varied] and minibatch.filtered == (flat,) and minibatch.trained == [varied]


@pytest.mark.parametrize(("kind", "trained"), [(Sync, 1), (Pace, 0)])
def test_only_sync_trains_the_first_group_of_a_step_whose_groups_all_have_constant_rewards(
    kind: type[Sync] | type[Pace], trained: int
) -> None:
    schedule = kind(2, 1, 0, filter_constant=True)
    first, second = _group(0, (1.0, 1.0)), _group(1, (0.0, 0.0))
    for group in (first, second):
        schedule.classify(group, 0)
    minibatch = schedule.next_minibatch(0)
    assert minibatch is not None and minibatch.trained == [first][:trained]


def test_oldest_first_filters_on_arrival_so_its_steps_hold_nothing_to_filter() -> None:
    schedule = OldestFirst(1, filter_constant=True)
    assert schedule.classify(_group(0, (1.0, 1.0), step=0), 0) is Verdict.FILTER
    varied = _group(1, (1.0, 0.0))
    assert schedule.classify(varied, 0) is Verdict.KEEP
    minibatch = schedule.next_minibatch(0)
    assert minibatch is not None and minibatch.filtered == () and minibatch.trained == [varied]
