"""StepRunner on its own: a step's requests submitted back to back, then waited for, then its weights published."""

from __future__ import annotations

import trio
from tinker import types as tinker_types
from trio.testing import MockClock

from tests.work_items import finished_group, work_item
from trio_rl import _tinker_compat as compat
from trio_rl.loop.publishing import InflightWeights, SnapshotWeights, WeightsPublishing
from trio_rl.loop.schedules import Minibatch
from trio_rl.loop.step_runner import StepRunner, StepSettings
from trio_rl.loop.weights import LatestWeights
from trio_rl.loop.work import FinishedGroup
from trio_rl.testing import FakeBackend

DEADLINE_S = 100.0
"""Virtual seconds; under autojump a step that waits for nothing fails at once."""
ADAM = tinker_types.AdamParams(learning_rate=1e-3)


def _group(order: int, rewards: tuple[float, ...] = (1.0, 0.0)) -> FinishedGroup:
    """A finished group of batch 0 with one datum (its prompt's tokens carry its order)."""
    group = finished_group(work_item(order), 0, rewards=rewards)
    group.data = [
        tinker_types.Datum(
            model_input=compat.model_input_from_ints([1, 2 + order]),
            loss_fn_inputs={
                "target_tokens": compat.tensor([2 + order, 3], "int64"),
                "logprobs": compat.tensor([-1.0, -1.0], "float32"),
                "advantages": compat.tensor([0.5, 0.5], "float32"),
            },
        )
    ]
    return group


async def _runner(
    backend: FakeBackend, publishing: WeightsPublishing | None = None
) -> tuple[StepRunner, LatestWeights]:
    """A runner on a fresh training client of ``backend``, its version 0 published."""
    client = await backend.create_training_client(base_model="fake")
    weights = LatestWeights()
    weights.publish(0, await client.save_weights_for_sampler("000000"))
    settings = StepSettings(loss_fn="importance_sampling", loss_fn_config=None, adam_params=ADAM)
    return StepRunner(client, weights, publishing or SnapshotWeights(), settings), weights


def _summary(groups: list[FinishedGroup]) -> dict[str, float]:
    return {"groups": float(len(groups))}


async def test_a_steps_requests_are_submitted_back_to_back_and_its_weights_published_after(
    autojump_clock: MockClock,
) -> None:
    backend = FakeBackend(train_latency=1.0)
    runner, weights = await _runner(backend)
    with trio.fail_after(DEADLINE_S):
        runner.begin(0)
        await runner.submit(Minibatch([_group(0)], optim_step=False))
        await runner.submit(Minibatch([_group(1)], optim_step=True, skipped=1))
        assert trio.current_time() == 0.0  # nothing waited for yet
        done = await runner.finish(_summary)
    assert done is not None and done.step == 0 and done.skipped == 1
    assert [g.item.order for g in done.trained] == [0, 1] and done.summary == {"groups": 2.0}
    requests = [c for c in backend.calls if c.kind in ("forward_backward", "optim_step")]
    assert [c.kind for c in requests] == ["forward_backward", "forward_backward", "optim_step"]
    assert all(c.time == 0.0 for c in requests)
    # Published once the answers are in: the two forward_backward passes of 1 s each, in order.
    save = backend.calls_of("save_weights_for_sampler")[-1]
    assert (save.detail["name"], save.time, save.detail["inflight"]) == ("000001", 2.0, False)
    version, client = weights.latest()
    assert version == 1 and client.model_path == "fake://sampler/000001"


async def test_a_step_whose_groups_are_all_filtered_trains_nothing_and_keeps_the_weights(
    autojump_clock: MockClock,
) -> None:
    backend = FakeBackend()
    runner, weights = await _runner(backend)
    _, before = weights.latest()
    constant = _group(0, rewards=(1.0, 1.0))
    with trio.fail_after(DEADLINE_S):
        runner.begin(0)
        await runner.submit(Minibatch([constant], optim_step=True, filtered=(constant,)))
        done = await runner.finish(_summary)
    assert done is not None and done.trained == [] and [g.item.order for g in done.taken] == [0]
    # No gradients: neither a forward_backward nor an optimizer step that would move Adam's momentum.
    assert backend.calls_of("forward_backward") == backend.calls_of("optim_step") == []
    assert weights.latest() == (1, before)


async def test_a_step_trains_only_the_groups_its_schedule_did_not_filter(autojump_clock: MockClock) -> None:
    backend = FakeBackend()
    runner, weights = await _runner(backend)
    constant = _group(1, (0.0, 0.0))
    with trio.fail_after(DEADLINE_S):
        runner.begin(0)
        await runner.submit(Minibatch([_group(0), constant, _group(2)], optim_step=True, filtered=(constant,)))
        done = await runner.finish(_summary)
    assert done is not None and [g.item.order for g in done.trained] == [0, 2]
    assert [g.item.order for g in done.taken] == [0, 1, 2] and done.summary == {"groups": 3.0}
    assert [c.detail["data"] for c in backend.calls_of("forward_backward")] == [2]
    assert len(backend.calls_of("optim_step")) == 1 and weights.version == 1


async def test_a_step_with_no_group_is_no_step(autojump_clock: MockClock) -> None:
    backend = FakeBackend()
    runner, weights = await _runner(backend)
    with trio.fail_after(DEADLINE_S):
        runner.begin(3)
        assert await runner.finish(_summary) is None
    assert weights.version == 0 and backend.calls_of("forward_backward") == []


async def test_an_inflight_run_publishes_in_flight_and_evaluates_a_pinned_snapshot(autojump_clock: MockClock) -> None:
    backend = FakeBackend()
    runner, weights = await _runner(backend, InflightWeights())
    with trio.fail_after(DEADLINE_S):
        runner.begin(0)
        await runner.submit(Minibatch([_group(0)], optim_step=True))
        await runner.finish(_summary)
        version, latest = weights.latest()
        pinned = await runner.weights_to_evaluate(version, latest)
    saves = backend.calls_of("save_weights_for_sampler")
    assert [(c.detail["name"], c.detail["inflight"]) for c in saves[1:]] == [("000001", True), ("000001-eval", False)]
    assert getattr(latest, "inflight", None) is True and getattr(pinned, "inflight", None) is False


async def test_a_step_cancelled_after_it_submitted_is_completed_with_what_it_submitted(
    autojump_clock: MockClock,
) -> None:
    backend = FakeBackend(train_latency=5.0)
    runner, weights = await _runner(backend)
    with trio.fail_after(DEADLINE_S):
        runner.begin(0)
        await runner.submit(Minibatch([_group(0)], optim_step=False))
        with trio.move_on_after(1.0):
            await runner.submit(Minibatch([_group(1)], optim_step=True))
            await runner.finish(_summary)
        with trio.CancelScope(shield=True):
            done = await runner.finish_interrupted(_summary)
    assert done is not None and [g.item.order for g in done.taken] == [0, 1]
    # The submitted requests are not taken back; the substep still gets its optimizer step.
    assert [c.kind for c in backend.calls if c.kind in ("forward_backward", "optim_step")][-1] == "optim_step"
    assert weights.version == 0  # nothing published: the caller saves the state it completed
