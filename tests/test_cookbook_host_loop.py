"""trio_rl.cookbook.host_loop: Trio as a guest of an asyncio loop, asyncio user code on that loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import trio
import trio.lowlevel

from trio_rl.asyncio_bridge import DualSamplingClient, call_user, current_runner, open_user_code_runner
from trio_rl.cookbook.host_loop import HostLoopRunner, run_as_guest

TIMEOUT_S = 30.0


async def asyncio_env_step(x: int) -> tuple[int, str]:
    """What cookbook envs do: to_thread, create_task, a contended lock, sleep."""
    lock = asyncio.Lock()

    async def locked(v: int) -> int:
        async with lock:
            await asyncio.sleep(0.001)
            return v

    first, second = await asyncio.gather(asyncio.create_task(locked(x)), locked(x + 1))
    name = await asyncio.to_thread(lambda: threading.current_thread().name)
    return first + second, name


def run_guest(async_fn: Any, *args: Any) -> Any:
    async def host() -> Any:
        return await asyncio.wait_for(run_as_guest(async_fn, *args), TIMEOUT_S)

    return asyncio.run(host())


def test_asyncio_user_code_runs_on_the_host_loop() -> None:
    async def trio_side() -> tuple[Any, Any, str]:
        async with open_user_code_runner("always"):
            runner = current_runner()
            host_loop_id = None

            async def which_loop() -> int:
                return id(asyncio.get_running_loop())

            host_loop_id = await call_user(which_loop)
            return await call_user(asyncio_env_step, 3), host_loop_id, type(runner).__name__

    async def host() -> tuple[Any, int]:
        result = await asyncio.wait_for(run_as_guest(trio_side), TIMEOUT_S)
        return result, id(asyncio.get_running_loop())

    (step, loop_id, runner_name), host_id = asyncio.run(host())
    assert step[0] == 7 and step[1] != threading.current_thread().name
    assert loop_id == host_id
    assert runner_name == HostLoopRunner.__name__


class _TrioClient:
    def __init__(self) -> None:
        self.calls = 0

    async def compute_logprobs(self, prompt: Any) -> list[float | None]:
        await trio.lowlevel.checkpoint()  # Trio-only: fails if it ran as asyncio
        self.calls += 1
        return [None, -1.0]


def test_asyncio_code_awaits_a_trio_sampling_client() -> None:
    client = _TrioClient()

    async def evaluator(sampling_client: Any) -> list[float | None]:
        a, b = await asyncio.gather(sampling_client.compute_logprobs_async(1), sampling_client.compute_logprobs(2))
        assert a == b
        return a  # type: ignore[no-any-return]

    async def trio_side() -> list[float | None]:
        async with open_user_code_runner("always"):
            return await call_user(evaluator, DualSamplingClient.wrap(client))  # type: ignore[arg-type]

    assert run_guest(trio_side) == [None, -1.0]
    assert client.calls == 2


def test_an_asyncio_error_reaches_the_trio_caller_as_itself() -> None:
    async def broken() -> None:
        await asyncio.sleep(0)
        raise KeyError("env")

    async def trio_side() -> str:
        async with open_user_code_runner("always"):
            with pytest.raises(KeyError, match="env"):
                await call_user(broken)
            return "caught"

    assert run_guest(trio_side) == "caught"


def test_a_trio_error_comes_out_of_the_guest_run_as_itself() -> None:
    async def trio_side() -> None:
        await trio.lowlevel.checkpoint()
        raise ValueError("stage")

    with pytest.raises(ValueError, match="stage"):
        run_guest(trio_side)


def test_cancelling_the_host_task_cancels_the_run_and_its_asyncio_calls() -> None:
    events: list[str] = []

    async def slow_env() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            events.append("asyncio cleanup")

    async def trio_side() -> None:
        try:
            async with open_user_code_runner("always"):
                await call_user(slow_env)
        finally:
            events.append("trio cleanup")

    async def host() -> None:
        task = asyncio.create_task(run_as_guest(trio_side))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, TIMEOUT_S)

    asyncio.run(host())
    assert events == ["asyncio cleanup", "trio cleanup"]


def test_cancelling_the_trio_caller_cancels_the_asyncio_task() -> None:
    ended = []

    async def slow() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def trio_side() -> bool:
        async with open_user_code_runner("always"):
            with trio.move_on_after(0.05) as scope:
                await call_user(slow)
            return scope.cancelled_caught

    assert run_guest(trio_side) is True
    assert ended == ["cancelled"]
