"""A rollout's per-turn calls: spans only where the run records them, and nothing recorded otherwise."""

from __future__ import annotations

from typing import Any

import trio

from trio_rl.asyncio_bridge import current_runner
from trio_rl.observe import SpanRecord, Watch, watching
from trio_rl.observe.spans import recording_spans
from trio_rl.observe.timed_calls import TimedPolicy, TimedUserCalls


class _StepWithoutName:
    """An env method that is a callable object, with no ``__name__``."""

    async def __call__(self, tokens: list[int]) -> int:
        await trio.sleep(2)
        return len(tokens)


async def test_timed_calls_record_sample_and_env_spans_with_the_calls_results(autojump_clock: object) -> None:
    records: list[SpanRecord] = []

    async def policy(ob: str, stop: list[str]) -> str:
        await trio.sleep(1)
        return ob + "!"

    async def initial_observation() -> str:
        return "ob"

    with watching(Watch(records.append)):
        assert recording_spans()
        calls = TimedUserCalls(current_runner())
        assert await calls.call(initial_observation) == "ob"
        assert await TimedPolicy(policy)("ob", []) == "ob!"
        step: Any = calls.bind(_StepWithoutName())
        assert await step([1, 2, 3]) == 3
    assert [(r.name, r.end - r.start) for r in records] == [
        ("env_initial_observation", 0),
        ("sample", 1),
        ("env_call", 2),
    ]


async def test_nothing_is_recorded_where_spans_are_not() -> None:
    with watching(Watch()):  # the stall report only: spans are not recorded
        assert not recording_spans()
    assert not recording_spans()  # outside any run
