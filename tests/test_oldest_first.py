"""The "oldest_first" policy, rule by rule, in virtual time: tinker-cookbook 0.6.1's async loop.

Each rule of 0.6.1's ``do_async_training`` has a test here: the slots, the
oldest weights first, leftovers carried over, the final smaller step, a slot
freed only once the new weights are published, a filtered group's slot freed at
once, and stragglers trained late (beyond K) rather than waited for or dropped.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.pipeline_helpers import make_config, run_fake, straggling_group_1
from tests.work_items import finished_group, work_item
from trio_rl import AsyncConfig, OldestFirst, TrainResult
from trio_rl.loop.schedules import Need, Position, Verdict
from trio_rl.loop.work import SkippedGroup
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec, FakeSamplerModel


def _orders(schedule: OldestFirst, step: int) -> list[int]:
    minibatch = schedule.next_minibatch(step)
    assert minibatch is not None
    assert schedule.next_minibatch(step) is None
    return [g.item.order for g in minibatch.groups]


def _config(log_path: Path, k: int, groups_per_batch: int, **overrides: Any) -> Any:
    async_config = AsyncConfig(max_steps_off_policy=k, groups_per_batch=groups_per_batch)
    return make_config(log_path, "oldest_first", async_config=async_config, **overrides)


def _timed_backend(seconds: dict[int, float] | float, train_latency: float) -> FakeBackend:
    """A sampler model where each response of group ``g`` takes ``seconds[g]`` (or ``seconds``) virtual seconds.

    Its ``sequences`` record when each response started and which weights sampled it.
    """

    def length(prompt: Sequence[int], index: int) -> int:
        group = prompt[1] - 2
        return round((seconds if isinstance(seconds, float) else seconds.get(group, 1.0)) / TOKEN_S)

    return FakeBackend(
        train_latency=train_latency, sampler=FakeSamplerModel(token_latency=TOKEN_S, response_length=length)
    )


TOKEN_S = 0.25
MAX_TOKENS = 64


def _first_samples(backend: FakeBackend) -> dict[tuple[int, int], tuple[float, int]]:
    """(batch, group) -> when its first response started and the weights version it sampled from."""
    first: dict[tuple[int, int], tuple[float, int]] = {}
    for sequence in sorted(backend.sequences, key=lambda s: s.started):
        first.setdefault((sequence.prompt[0] - 1, sequence.prompt[1] - 2), (sequence.started, sequence.version))
    return first


def _steps(backend: FakeBackend) -> list[list[tuple[int, int]]]:
    """The groups each forward_backward trained, as (batch, group)."""
    return [[tuple(key) for key in call.detail["groups"]] for call in backend.calls_of("forward_backward")]


def test_oldest_first_is_the_default_async_policy() -> None:
    assert AsyncConfig(max_steps_off_policy=1, groups_per_batch=4).staleness == "oldest_first"


def test_a_step_trains_the_groups_sampled_from_the_oldest_weights_then_the_first_finished() -> None:
    schedule = OldestFirst(groups_per_step=2, staleness_limit=1)
    assert not schedule.resamples and not schedule.samples_exact_version and schedule.gives_up_at(0) is None
    arrivals = [
        finished_group(work_item(0), 2, finished_at=1.0),
        finished_group(work_item(1), 1, finished_at=3.0),
        finished_group(work_item(2), 1, finished_at=2.0),
        finished_group(work_item(3), 0, finished_at=4.0),
    ]
    for group in arrivals:
        assert schedule.classify(group, step=3) is Verdict.KEEP  # never discarded for staleness
    # Version 0, then the version-1 group that finished first.
    assert _orders(schedule, 3) == [3, 2]


def test_groups_finished_at_the_same_instant_are_taken_by_identity() -> None:
    schedule = OldestFirst(groups_per_step=2)
    for order in (5, 1, 3):
        schedule.classify(finished_group(work_item(order), 0, finished_at=7.0), step=0)
    assert _orders(schedule, 0) == [1, 3]


def test_a_step_waits_for_a_full_batch_then_takes_everything_finished_by_that_instant() -> None:
    schedule = OldestFirst(groups_per_step=2, staleness_limit=1)
    assert schedule.need(0, ended=False) is Need.ANOTHER_GROUP
    schedule.classify(finished_group(work_item(0), 0), step=0)
    # A failed group does not count toward the batch.
    assert schedule.classify(SkippedGroup(work_item(1), RuntimeError("env")), step=0) is Verdict.SKIP
    assert schedule.need(0, ended=False) is Need.ANOTHER_GROUP
    schedule.classify(finished_group(work_item(2), 0), step=0)
    assert schedule.need(0, ended=False) is Need.THIS_INSTANT
    schedule.next_minibatch(0)
    assert schedule.need(0, ended=False) is Need.NOTHING


def test_leftovers_carry_over_to_the_next_step() -> None:
    schedule = OldestFirst(groups_per_step=2, staleness_limit=1)
    for order, version in [(0, 0), (1, 0), (2, 0)]:
        schedule.classify(finished_group(work_item(order), version, finished_at=order), step=0)
    assert _orders(schedule, 0) == [0, 1]
    # Group 2 waits in the pool: one more arrival makes a full batch for step 1.
    assert schedule.need(1, ended=False) is Need.ANOTHER_GROUP
    schedule.classify(finished_group(work_item(3), 1), step=1)
    assert schedule.need(1, ended=False) is Need.THIS_INSTANT
    assert _orders(schedule, 1) == [2, 3]


def test_at_the_end_of_data_the_groups_left_form_a_final_smaller_step() -> None:
    schedule = OldestFirst(groups_per_step=4)
    schedule.classify(finished_group(work_item(0), 0), step=0)
    assert schedule.need(0, ended=True) is Need.THIS_INSTANT
    assert _orders(schedule, 0) == [0]
    assert schedule.next_minibatch(1) is None


def test_a_constant_reward_group_is_filtered_on_arrival_only_when_asked() -> None:
    constant = finished_group(work_item(0), 0, rewards=(1.0, 1.0))
    assert OldestFirst(2, filter_constant=True).classify(constant, step=0) is Verdict.FILTER
    assert OldestFirst(2, filter_constant=False).classify(constant, step=0) is Verdict.KEEP


def test_admission_holds_at_most_b_times_k_plus_one_groups_unconsumed() -> None:
    schedule = OldestFirst(groups_per_step=3, staleness_limit=2)
    bounds = [schedule.admit(Position(n, 0, 0, 0, 3), start_step=5).consumed_before for n in range(12)]
    assert bounds == [0] * 9 + [1, 2, 3]
    assert schedule.admit(Position(0, 0, 0, 0, 3), start_step=5).min_version == 5


# ---------------------------------------------------------------- through train(), in virtual time


async def test_groups_started_and_not_yet_trained_fill_the_slots_and_never_exceed_them(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = _timed_backend({1: 10.0}, train_latency=0.5)
    config = _config(log_path, k=2, groups_per_batch=3, max_tokens=MAX_TOKENS)
    result = await run_fake(config, FakeDataset(8, 3), backend)
    assert result.trained_groups == 24
    # A group holds its slot from its first sample until its step's weights are published.
    published = {call.version: call.time for call in backend.calls_of("save_weights_for_sampler")}
    released = {key: published[step + 1] for step, groups in enumerate(_steps(backend)) for key in groups}
    held = [(started, released[key]) for key, (started, _) in _first_samples(backend).items()]
    most = max(sum(1 for start, end in held if start <= t < end) for t, _ in held)
    assert most == 3 * (2 + 1)


@pytest.mark.parametrize("k", [0, 2])
async def test_a_trained_groups_slot_is_freed_only_once_the_new_weights_are_published(
    log_path: Path, k: int, autojump_clock: MockClock
) -> None:
    # Training takes 5 s and sampling 1 s: were slots freed before the publish,
    # the next groups would start on the weights just trained on.
    backend = _timed_backend(1.0, train_latency=5.0)
    groups_per_batch = 2
    config = _config(log_path, k=k, groups_per_batch=groups_per_batch, max_tokens=MAX_TOKENS)
    await run_fake(config, FakeDataset(6, 2), backend)
    saves = {call.version: call.time for call in backend.calls_of("save_weights_for_sampler")}
    first_sample = _first_samples(backend)
    slots = groups_per_batch * (k + 1)
    for n, key in enumerate(sorted(first_sample)):
        started, version = first_sample[key]
        if n < slots:
            assert started == pytest.approx(0.0, abs=1e-6) and version == 0
            continue
        # Group n waits for the step that frees the (n - slots)-th slot: step (n - slots) // B.
        step = (n - slots) // groups_per_batch
        assert version == step + 1 and started >= saves[step + 1]


async def test_a_filtered_groups_slot_is_freed_at_once(log_path: Path, autojump_clock: MockClock) -> None:
    # One slot (K=0, one group per step); group 0 has constant rewards and is filtered.
    spec = FakeEnvSpec(constant_reward_groups={(0, 0)})
    backend = _timed_backend(1.0, train_latency=50.0)
    config = _config(log_path, k=0, groups_per_batch=1, remove_constant_reward_groups=True, max_tokens=MAX_TOKENS)
    result = await run_fake(config, FakeDataset(3, 1, spec), backend)
    starts = {batch: started for (batch, _), (started, _) in _first_samples(backend).items()}
    # Batch 1 starts when batch 0 is filtered (t=1), not after a step (50 s).
    assert starts[1] == pytest.approx(1.0)
    assert result.trained_groups == 2 and result.summary["run/filtered_constant"] == 1
    assert [len(groups) for groups in _steps(backend)] == [1, 1]


async def test_stragglers_are_trained_late_beyond_k_and_nothing_is_dropped_or_waited_for(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=straggling_group_1, train_latency=0.5)
    dataset = FakeDataset(8, 4)
    result = await run_fake(_config(log_path, k=1, groups_per_batch=4), dataset, backend)
    assert result.trained_groups == 32 and result.dropped_groups == 0
    assert result.summary["run/requeued"] == 0 and result.summary["run/cancelled_groups"] == 0
    assert max(r["async/staleness_max"] for r in result.step_metrics) > 1
    trained = [key for step in _steps(backend) for key in step]
    assert sorted(trained) == sorted({(b, g) for b in range(8) for g in range(4)})
    # No step waited for a straggler: the first step trains at t=1 without group 1 of batch 0.
    first = backend.calls_of("forward_backward")[0]
    assert first.time == pytest.approx(1.0) and (0, 1) not in _steps(backend)[0]


async def _final_step_run(log_path: Path) -> tuple[TrainResult, FakeBackend]:
    backend = FakeBackend(sample_latency=straggling_group_1, train_latency=0.5)
    result = await run_fake(_config(log_path, k=1, groups_per_batch=4), FakeDataset(5, 2), backend)
    return result, backend


async def test_steps_do_not_follow_dataset_batches_and_the_last_groups_form_a_smaller_step(
    log_path: Path, autojump_clock: MockClock
) -> None:
    result, _backend = await _final_step_run(log_path)
    # 10 groups in batches of 2, 4 per step: steps of 4, 4, then 2.
    assert [r["progress/groups"] for r in result.step_metrics] == [4, 4, 2]
    assert result.trained_groups == 10


async def test_which_groups_each_step_trains_does_not_depend_on_trios_task_order(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    runs = []
    for attempt in range(3):
        _, backend = await _final_step_run(tmp_path / str(attempt))
        runs.append(_steps(backend))
    assert runs[0] == runs[1] == runs[2]


async def test_each_step_trains_the_oldest_completed_groups_through_train(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = _timed_backend({1: 10.0, 2: 3.0}, train_latency=0.5)
    config = _config(log_path, k=2, groups_per_batch=2, max_tokens=MAX_TOKENS)
    result = await run_fake(config, FakeDataset(6, 4), backend)
    assert result.trained_groups == 24
    versions = {key: version for key, (_, version) in _first_samples(backend).items()}
    completed: dict[tuple[int, int], float] = defaultdict(float)
    for sequence in backend.sequences:
        key = (sequence.prompt[0] - 1, sequence.prompt[1] - 2)
        completed[key] = max(completed[key], sequence.ended)
    trained_so_far: set[tuple[int, int]] = set()
    for call in backend.calls_of("forward_backward"):
        step = {tuple(key) for key in call.detail["groups"]}
        trained_so_far |= step
        # Every group completed before this step and left for later was sampled
        # from weights at least as new as the newest this step trained.
        waiting = [
            versions[key] for key in completed if key not in trained_so_far and completed[key] < call.time - 1e-6
        ]
        assert all(version >= max(versions[key] for key in step) for version in waiting)
    # And stragglers did make some step train older weights than an earlier step did.
    oldest = [
        min(versions[tuple(key)] for key in call.detail["groups"]) for call in backend.calls_of("forward_backward")
    ]
    assert oldest != sorted(oldest)


async def test_a_resumed_run_samples_every_untrained_group_again_once(
    log_path: Path, autojump_clock: MockClock
) -> None:
    # Cancelled while stragglers are out and completed groups wait in the pool.
    backend = _timed_backend({1: 10.0}, train_latency=0.5)
    config = _config(log_path, k=2, groups_per_batch=2, max_tokens=MAX_TOKENS, save_on_cancel=True)
    with trio.move_on_after(4.2):
        await run_fake(config, FakeDataset(6, 4), backend)
    first = [key for step in _steps(backend) for key in step]
    assert 0 < len(first) < 24
    sampled_before = len(_first_samples(backend))
    assert sampled_before > len(first)  # some were sampled, or finished, and never trained
    await run_fake(replace(config, resume=True), FakeDataset(6, 4), backend)
    trained = [key for step in _steps(backend) for key in step]
    assert sorted(trained) == sorted((b, g) for b in range(6) for g in range(4))
