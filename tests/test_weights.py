"""LatestWeights on its own: the newest sampling client, publishing in order, and waiting for a version."""

from __future__ import annotations

import pytest
import trio
from trio.testing import MockClock

from trio_rl.loop.weights import LatestWeights
from trio_rl.testing import FakeBackend, FakeSamplingClient

DEADLINE_S = 100.0
"""Virtual seconds; under autojump a waiter that is never woken fails at once."""


def _client(version: int) -> FakeSamplingClient:
    return FakeSamplingClient(FakeBackend(), version=version, model_path=None)


def test_nothing_is_published_before_the_first_publish() -> None:
    weights = LatestWeights()
    assert weights.version == -1
    with pytest.raises(RuntimeError, match="no weights have been published yet"):
        weights.latest()
    with pytest.raises(RuntimeError, match="no weights have been published yet"):
        weights.advance(0)


def test_publish_makes_a_client_the_newest_and_advance_keeps_it() -> None:
    weights = LatestWeights()
    first, second = _client(0), _client(1)
    weights.publish(0, first)
    assert weights.latest() == (0, first)
    weights.publish(1, second)
    assert weights.latest() == (1, second) and weights.version == 1
    # A step that trained nothing: a new version, the same weights.
    weights.advance(2)
    assert weights.latest() == (2, second)


@pytest.mark.parametrize("stale", [3, 2])
def test_a_version_not_above_the_newest_is_refused_and_changes_nothing(stale: int) -> None:
    weights = LatestWeights()
    newest = _client(3)
    weights.publish(3, newest)
    with pytest.raises(ValueError, match=f"version {stale} published after version 3"):
        weights.publish(stale, _client(stale))
    with pytest.raises(ValueError, match=f"version {stale} published after version 3"):
        weights.advance(stale)
    assert weights.latest() == (3, newest)


async def test_each_waiter_wakes_when_its_version_is_published(autojump_clock: MockClock) -> None:
    weights = LatestWeights()
    woke: dict[int, float] = {}

    async def wait(version: int) -> None:
        await weights.wait_for(version)
        woke[version] = trio.current_time()

    async def publish_each_second() -> None:
        client = _client(0)
        for version in range(4):
            await trio.sleep(1.0)
            weights.publish(version, client)

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            for version in (3, 0, 1):
                nursery.start_soon(wait, version)
            nursery.start_soon(publish_each_second)
    assert woke == {0: 1.0, 1: 2.0, 3: 4.0}


async def test_a_version_published_already_is_not_waited_for(autojump_clock: MockClock) -> None:
    weights = LatestWeights()
    weights.publish(2, _client(2))
    with trio.fail_after(DEADLINE_S):
        await weights.wait_for(1)
        await weights.wait_for(2)
    assert trio.current_time() == 0.0


async def test_versions_published_back_to_back_wake_a_waiter_for_the_later_one(autojump_clock: MockClock) -> None:
    # Two publications with no checkpoint between them: the first event is set and
    # replaced before the waiter runs, and the waiter must still see the second.
    weights = LatestWeights()
    woke: list[float] = []

    async def wait() -> None:
        await weights.wait_for(1)
        woke.append(trio.current_time())

    with trio.fail_after(DEADLINE_S):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait)
            await trio.sleep(1.0)
            client = _client(0)
            weights.publish(0, client)
            weights.publish(1, client)
    assert woke == [1.0]
