"""Schedules only decide: their answers, and a new kind of schedule running through train() unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
from trio.testing import MockClock

from tests.pipeline_helpers import make_config, run_fake
from tests.work_items import finished_group, work_item
from trio_rl import Config, Pace, Requeue, TrainResult
from trio_rl.loop import train as train_module
from trio_rl.loop.schedules import Need, Schedule, StepClock, Verdict
from trio_rl.loop.work import Delivery, FinishedGroup, SkippedGroup
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec


def test_pace_waits_for_every_group_of_its_step_then_trains_them_in_admission_order() -> None:
    pace = Pace(groups_per_step=3, num_substeps=1, staleness_limit=1)
    arrivals: list[Delivery] = [
        finished_group(work_item(2, step=0, step_size=3), 0),
        SkippedGroup(work_item(1, step=0, step_size=3), RuntimeError("env")),
        finished_group(work_item(3, step=1, step_size=3), 0),
    ]
    assert pace.need(0, ended=False) is Need.ANOTHER_GROUP
    assert [pace.classify(d, 0) for d in arrivals] == [Verdict.KEEP, Verdict.SKIP, Verdict.KEEP]
    assert pace.need(0, ended=False) is Need.ANOTHER_GROUP  # group 0 is still out
    assert pace.classify(finished_group(work_item(0, step=0, step_size=3), 0), 0) is Verdict.KEEP
    assert pace.need(0, ended=False) is Need.THIS_INSTANT  # complete: decided after this instant
    minibatch = pace.next_minibatch(0)
    assert minibatch is not None and minibatch.optim_step and minibatch.skipped == 1
    assert [g.item.order for g in minibatch.groups] == [0, 2]
    assert pace.next_minibatch(0) is None
    # Step 1 holds one of its three groups; at the end of data it trains that one.
    assert pace.need(1, ended=False) is Need.ANOTHER_GROUP
    assert pace.need(1, ended=True) is Need.NOTHING
    last = pace.next_minibatch(1)
    assert last is not None and [g.item.order for g in last.groups] == [3]


def test_requeue_resamples_what_is_too_stale_and_trains_the_oldest_fresh_groups() -> None:
    requeue = Requeue(groups_per_step=2, num_substeps=1, staleness_limit=1)
    assert requeue.resamples and not requeue.samples_exact_version
    assert requeue.gives_up_at(3) == 5
    assert requeue.classify(finished_group(work_item(0), version=0), step=2) is Verdict.RESAMPLE  # 2 steps stale
    assert requeue.classify(finished_group(work_item(1), version=1), step=2) is Verdict.KEEP
    assert requeue.need(2, ended=False) is Need.ANOTHER_GROUP
    assert requeue.classify(finished_group(work_item(2), version=2), step=2) is Verdict.KEEP
    assert requeue.classify(finished_group(work_item(3), version=1), step=2) is Verdict.KEEP
    # Enough fresh groups: take whatever else finished at this instant, then decide.
    assert requeue.need(2, ended=False) is Need.THIS_INSTANT
    minibatch = requeue.next_minibatch(2)
    assert minibatch is not None and [g.item.order for g in minibatch.groups] == [1, 3]
    assert requeue.need(2, ended=False) is Need.NOTHING and requeue.next_minibatch(2) is None
    # At step 4 the group sampled from version 2 is more than one step stale.
    assert [item.order for item in requeue.expired(4)] == [2]
    assert requeue.need(4, ended=True) is Need.THIS_INSTANT and requeue.next_minibatch(4) is None


class _FilterOnArrival(Requeue):
    """Filters constant-reward groups the moment they arrive, as tinker-cookbook 0.6.1's async loop does."""

    def classify(self, delivery: Delivery, step: int) -> Verdict:
        if isinstance(delivery, FinishedGroup) and delivery.summary.constant_reward:
            return Verdict.FILTER
        return super().classify(delivery, step)


async def _run_filtering(log_path: Path) -> TrainResult:
    spec = FakeEnvSpec(constant_reward_groups=CONSTANT)
    config = make_config(log_path, "requeue", remove_constant_reward_groups=True)
    return await run_fake(config, FakeDataset(5, 4, spec), FakeBackend(sample_latency=1.0, train_latency=0.5))


CONSTANT = {(0, 1), (2, 0), (2, 3), (4, 2)}


def test_requeue_stops_waiting_at_the_end_of_data_after_k_plus_one_mean_steps() -> None:
    requeue = Requeue(groups_per_step=4, num_substeps=1, staleness_limit=1)
    # Two steps began 3 s apart on average; the data ended 2 s into the third.
    assert requeue.stop_waiting_at(StepClock(first_start=10.0, start=16.0, steps=2, data_ended=18.0)) == 24.0
    # Ended before the step began: counted from the step's start.
    assert requeue.stop_waiting_at(StepClock(first_start=10.0, start=16.0, steps=2, data_ended=12.0)) == 22.0
    # A run's first step has no pace to go by.
    assert requeue.stop_waiting_at(StepClock(first_start=10.0, start=10.0, steps=0, data_ended=10.0)) is None
    # No other schedule gives up a rollout at the end of data.
    assert Pace(4, 1, 1).stop_waiting_at(StepClock(10.0, 16.0, 2, 12.0)) is None


async def test_a_group_filtered_on_arrival_is_counted_as_filtered_and_never_joins_a_step(
    tmp_path: Path, autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    at_step = await _run_filtering(tmp_path / "at_step")

    def schedule(config: Config, dataset_batch_size: int) -> Schedule:
        return _FilterOnArrival(groups_per_step=4, num_substeps=1, staleness_limit=1)

    monkeypatch.setattr(train_module, "schedule_for", schedule)
    on_arrival = await _run_filtering(tmp_path / "on_arrival")
    for result in (at_step, on_arrival):
        assert result.trained_groups == 20 - len(CONSTANT)
        assert result.summary["run/filtered_constant"] == len(CONSTANT)
    # Filtered by the step runner, a group is taken by its step; filtered on arrival, never.
    assert sum(r["progress/groups"] for r in at_step.step_metrics) == 20
    assert sum(r["progress/groups"] for r in on_arrival.step_metrics) == 20 - len(CONSTANT)
    # Either way its rollout's tokens are counted once, as discarded, and in the cumulative count.
    for result in (at_step, on_arrival):
        last = result.step_metrics[-1]
        trained_sampled = sum(r["tokens/sampled"] for r in result.step_metrics)
        assert last["tokens/discarded/sampled"] > 0
        assert last["tokens/cumulative/sampled"] == trained_sampled + last["tokens/discarded/sampled"]
