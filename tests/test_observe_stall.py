"""The stall report and its watch, in virtual time; the task tree; the loop primitives' statistics()."""

from __future__ import annotations

import trio
import trio.testing

from trio_rl.loop.gate import ConsumptionGate
from trio_rl.loop.ledger import DataLedger
from trio_rl.loop.weights import LatestWeights
from trio_rl.loop.work import Handout, ItemKey, WorkItem
from trio_rl.observe import StallSnapshot, StallWatch, Watch, format_stall_report, format_task_tree, span, watching
from trio_rl.observe.stall import ActivitySeen
from trio_rl.observe.waits import names_at as suspended_names_at
from trio_rl.observe.waits import waits_by_activity


def _snapshot(now: float, activities: list[ActivitySeen]) -> StallSnapshot:
    return StallSnapshot(now, 10.0, 4, activities, ["0/1", "0/2"], {"weights": "W(version=4)"}, "root: waiting")


def test_the_report_names_each_group_with_age_attempt_and_wait() -> None:
    group = ActivitySeen("group 0/2", 20.0, attempt=1, waiting={"rollout": 2, "env_step": 1, "sample": 1})
    trainer = ActivitySeen("trainer", 0.0, waiting={"train_step": 1, "wait_for_groups": 1})
    text = format_stall_report(_snapshot(150.0, [trainer, group]))
    assert text.splitlines()[0].startswith("no training step has finished for 140.0 s (newest weights: version 4)")
    assert "  group 0/2: age 130.0 s, attempt 1, waiting on 2 x rollout, 1 x env_step, 1 x sample" in text
    assert "trainer: waiting on 1 x train_step, 1 x wait_for_groups" in text
    assert (
        "outstanding items, as the trainer last read the ledger: 0/1, 0/2" in text and "weights: W(version=4)" in text
    )
    assert text.endswith("Trio task tree:\n  root: waiting")


async def test_the_watch_reports_after_the_interval_then_every_interval(autojump_clock: object) -> None:
    reports: list[tuple[float, str]] = []
    watch = StallWatch(
        120.0, lambda last: _snapshot(trio.current_time(), []), lambda t: reports.append((trio.current_time(), t))
    )
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.run)
        await trio.sleep(100)
        watch.progressed()  # a step at t=100: no report at 120
        await trio.sleep(400)
        nursery.cancel_scope.cancel()
    assert [round(t - start) for t, _ in reports] == [220, 340, 460]


async def test_what_an_activity_waits_on_is_read_from_its_tasks_frames(autojump_clock: object) -> None:
    watch = Watch()  # no trace: spans record nothing, and the report still names them
    seen: dict[str, dict[str, int]] = {}
    with watching(watch):
        async with trio.open_nursery() as nursery:

            async def rollout() -> None:
                await trio.sleep_forever()  # waits on: env_step

            async def stuck_group() -> None:
                with watch.activity("group 3/0"), span("trajectory_group_worker"):
                    async with trio.open_nursery() as rollouts:
                        rollouts.start_soon(rollout)
                        rollouts.start_soon(rollout)
                        with span("make_envs"), span("compute_group_rewards"):
                            await trio.sleep_forever()

            async def other_activity() -> None:
                with watch.activity("trainer"), span("train_step"):
                    await trio.sleep_forever()

            nursery.start_soon(stuck_group)
            nursery.start_soon(other_activity)
            await trio.sleep(5)
            waits = waits_by_activity()
            # By name: Trio starts the two tasks in either order.
            seen = {a.what: dict(waits[key]) for key, a in watch.activities.items()}
            nursery.cancel_scope.cancel()
    assert seen == {
        "group 3/0": {"trajectory_group_worker": 1, "make_envs": 1, "compute_group_rewards": 1, "env_step": 2},
        "trainer": {"train_step": 1},
    }
    assert watch.activities == {}


def test_span_blocks_are_found_in_the_source_and_a_non_literal_name_is_not() -> None:
    def body() -> None:
        with span("outer"):  # noqa: SIM117 (nested on purpose: blocks that start on different lines)
            with span("inner"), span(str(1)):
                pass  # waits on: marked

    first = body.__code__.co_firstlineno
    names = suspended_names_at(body.__code__.co_filename, first, first + 3)
    assert names == ["outer", "inner", "marked"]
    assert suspended_names_at(body.__code__.co_filename, first, first + 1) == ["outer"]


async def test_the_task_tree_names_each_task_and_where_it_waits() -> None:
    async def parked() -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(parked, name="parked-task")
        await trio.testing.wait_all_tasks_blocked()
        tree = format_task_tree()
        nursery.cancel_scope.cancel()
    line = next(line for line in tree.splitlines() if "parked-task" in line)
    assert (
        line.startswith("  ")
        and "waiting in test_the_task_tree_names_each_task_and_where_it_waits.<locals>.parked" in line
    )
    assert "in trio's sleep_forever" in line
    assert "running (this report)" in tree


async def test_the_loop_primitives_report_statistics() -> None:
    weights, gate = LatestWeights(), ConsumptionGate()
    ledger = DataLedger(ItemKey(0, 0), [])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(weights.wait_for, 1)
        nursery.start_soon(gate.wait_for_change)
        await trio.testing.wait_all_tasks_blocked()
        assert weights.statistics().tasks_waiting == 1 and weights.statistics().version == -1
        assert gate.statistics().tasks_waiting == 1
        ledger.notes.send_nowait(Handout(ItemKey(0, 0), ItemKey(0, 1)))
        assert ledger.statistics().notes_unread == 1 and ledger.statistics().outstanding == 0
        assert len(ledger.outstanding) == 1 and ledger.statistics().notes_unread == 0
        gate.free([WorkItem(ItemKey(0, i), i, None, attempt=0, min_version=0) for i in range(2)])  # type: ignore[arg-type]
        weights.publish(1, object())  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        assert gate.statistics().consumed == 2 and gate.statistics().tasks_waiting == 0
        assert weights.statistics().tasks_waiting == 0 and weights.statistics().version == 1
