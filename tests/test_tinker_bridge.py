"""Tests for trio_rl.backends._future_bridge: awaiting the tinker SDK's futures from Trio.

Real time throughout: threads and SDK futures don't count as activity for an
autojump clock. Every wait is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import concurrent.futures
import logging
import pickle
import threading
import time
from functools import partial
from typing import Any

import pytest
import trio
from tinker import types as tinker_types

from tests.polling import wait_until
from tests.tinker_sdk_standin import (
    StandinAPIFuture,
    StandinError,
    StandinServiceClient,
    open_standin_service,
)
from trio_rl.backends._future_bridge import (
    RemoteTimeoutError,
    as_concurrent_future,
    await_future,
    is_sdk_future,
    remote_deadline,
)

PROMPT = tinker_types.ModelInput.from_ints([1, 2, 3])
PARAMS = tinker_types.SamplingParams(max_tokens=4, seed=0)


def sampler(service: StandinServiceClient) -> Any:
    return service.create_sampling_client(base_model="standin").result()


def complete_later(fut: concurrent.futures.Future[Any], value: Any, delay: float) -> None:
    threading.Timer(delay, fut.set_result, args=(value,)).start()


async def test_waits_for_a_future_completed_by_another_thread() -> None:
    fut: concurrent.futures.Future[int] = concurrent.futures.Future()
    complete_later(fut, 42, 0.02)
    with trio.fail_after(5):
        assert await await_future(fut, what="test", timeout=5) == 42


async def test_already_finished_future_still_checkpoints() -> None:
    fut: concurrent.futures.Future[str] = concurrent.futures.Future()
    fut.set_result("done")
    with trio.fail_after(5), trio.CancelScope() as scope:
        scope.cancel()
        await await_future(fut, what="test", timeout=5)
    assert scope.cancelled_caught


async def test_api_future_from_the_standin(service: StandinServiceClient) -> None:
    api_future = sampler(service).sample(PROMPT, 2, PARAMS)
    assert isinstance(api_future, StandinAPIFuture)
    with trio.fail_after(5):
        response = await await_future(api_future, what="sample", timeout=5)
    assert len(response.sequences) == 2


async def test_standin_result_async_fails_under_trio_as_the_sdk_does(
    service: StandinServiceClient,
) -> None:
    api_future = sampler(service).sample(PROMPT, 1, PARAMS)
    with pytest.raises(RuntimeError, match="no running event loop"):
        await api_future.result_async()
    with trio.fail_after(5):
        await await_future(api_future, what="sample", timeout=5)


class CompatFuture(concurrent.futures.Future[Any]):
    """Like tinker 0.38's sample() result: a Future that also has .future(), and whose
    own Future methods must not be used (the SDK warns on them)."""

    def __init__(self, inner: concurrent.futures.Future[Any]) -> None:
        super().__init__()
        self.inner = inner

    def future(self) -> concurrent.futures.Future[Any]:
        return self.inner

    def add_done_callback(self, fn: Any) -> None:
        raise AssertionError("the bridge should use .future()")


async def test_prefers_future_method_over_the_future_itself() -> None:
    inner: concurrent.futures.Future[int] = concurrent.futures.Future()
    compat = CompatFuture(inner)
    assert as_concurrent_future(compat) is inner
    complete_later(inner, 7, 0.01)
    with trio.fail_after(5):
        assert await await_future(compat, what="sample", timeout=5) == 7


async def test_rejects_asyncio_only_futures() -> None:
    class AsyncioOnly:
        async def result_async(self) -> int:
            return 1

    assert not is_sdk_future(AsyncioOnly())
    with pytest.raises(TypeError, match=r"no \.future"):
        await await_future(AsyncioOnly(), what="x", timeout=1)  # type: ignore[arg-type]


async def test_exception_surfaces_as_itself(service: StandinServiceClient) -> None:
    error = StandinError("sampler exploded")
    service.fail_next("sample", error)
    with trio.fail_after(5), pytest.raises(StandinError) as excinfo:
        await await_future(sampler(service).sample(PROMPT, 1, PARAMS), what="sample", timeout=5)
    assert excinfo.value is error


async def test_cancelling_the_wait_cancels_the_request(service: StandinServiceClient) -> None:
    client = sampler(service)
    service.hold("sample")
    api_future = client.sample(PROMPT, 1, PARAMS)
    with trio.fail_after(5):
        await wait_until(lambda: service.pending("sample") == 1)
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(partial(await_future, api_future, what="sample", timeout=None))
                await trio.sleep(0.01)
                scope.cancel()
        assert api_future.future().cancelled()
        # The SDK-side request is withdrawn too, and nothing is left pending.
        await wait_until(lambda: service.cancelled["sample"] == 1)
        assert service.pending("sample") == 0
    assert service.loop_errors == []


async def test_deadline_names_the_call_and_cancels_the_future() -> None:
    fut: concurrent.futures.Future[None] = concurrent.futures.Future()  # never completes
    start = time.monotonic()
    with trio.fail_after(5), pytest.raises(RemoteTimeoutError) as excinfo:
        await await_future(fut, what="forward_backward", timeout=0.05)
    assert str(excinfo.value) == "forward_backward did not complete within 0.05 s"
    assert isinstance(excinfo.value, TimeoutError)
    assert (excinfo.value.what, excinfo.value.timeout) == ("forward_backward", 0.05)
    assert fut.cancelled()
    assert time.monotonic() - start < 1


async def test_outer_cancellation_is_not_reported_as_a_timeout() -> None:
    fut: concurrent.futures.Future[None] = concurrent.futures.Future()
    with trio.fail_after(5), trio.move_on_after(0.02) as outer:
        await await_future(fut, what="sample", timeout=10)
    assert outer.cancelled_caught
    assert fut.cancelled()


def test_deadline_message_for_a_round_number() -> None:
    error = RemoteTimeoutError("forward_backward", 120)
    assert str(error) == "forward_backward did not complete within 120.0 s"
    assert str(pickle.loads(pickle.dumps(error))) == str(error)


async def test_remote_deadline_rejects_negative_timeouts() -> None:
    with pytest.raises(ValueError, match="must be >= 0"), remote_deadline("x", -1.0):
        pass


def test_future_finishing_after_the_run_ended_raises_nothing_in_the_sdk_thread(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread_errors: list[threading.ExceptHookArgs] = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    caplog.set_level(logging.DEBUG)

    # A future that is already running cannot be cancelled (as in a thread pool), so
    # the bridge's done-callback is still registered when the Trio run is long gone.
    fut: concurrent.futures.Future[str] = concurrent.futures.Future()
    assert fut.set_running_or_notify_cancel()

    async def main() -> None:
        with pytest.raises(RemoteTimeoutError):
            await await_future(fut, what="sample", timeout=0.02)

    trio.run(main)
    assert not fut.cancelled()

    callbacks_done = threading.Event()
    fut.add_done_callback(lambda _: callbacks_done.set())  # runs after the bridge's
    sdk_thread = threading.Thread(target=fut.set_result, args=("late",), name="sdk")
    sdk_thread.start()
    sdk_thread.join(5)
    assert callbacks_done.wait(5)
    assert thread_errors == []
    # concurrent.futures logs (rather than raises) exceptions from done-callbacks.
    assert [r for r in caplog.records if r.name == "concurrent.futures"] == []


def test_late_completion_on_the_sdk_event_loop_is_silent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with open_standin_service() as service:
        fut: concurrent.futures.Future[str] = concurrent.futures.Future()
        assert fut.set_running_or_notify_cancel()

        async def main() -> None:
            with trio.move_on_after(0.02):
                await await_future(fut, what="sample", timeout=None)

        trio.run(main)
        loop = service._loop().loop  # the stand-in's SDK thread
        done = threading.Event()
        loop.call_soon_threadsafe(fut.set_result, "late")
        loop.call_soon_threadsafe(done.set)
        assert done.wait(5)
        assert service.loop_errors == []
    assert [r for r in caplog.records if r.name == "concurrent.futures"] == []
