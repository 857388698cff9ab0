"""Trio as a guest in an asyncio program: the run's asyncio calls go to the host's own loop.

A tinker-cookbook recipe calls ``asyncio.run(main(config))``. :func:`run_as_guest`
starts the trio_rl run with ``trio.lowlevel.start_guest_run`` inside that
running loop, so the recipe's envs, graders and evaluators run as ordinary
asyncio tasks of the loop they were written for (``asyncio.to_thread``,
aiohttp, ``asyncio.create_task`` and contended locks all behave as under
0.6.1), while the loop's stages stay Trio tasks in one nursery. Both run on
the host's thread, turn by turn; Trio's I/O waits run on a helper thread that
Trio manages.

:class:`HostLoopRunner` is the run's :class:`~trio_rl.asyncio_bridge.UserCodeRunner`
there: an asyncio-flavoured call becomes a task on the host loop that the Trio
caller waits for (cancelling the caller cancels the task and waits until it
has ended), and an asyncio task that awaits a trio_rl sampling client gets a
host-loop future of a Trio task that runs in the runner's nursery.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import outcome
import trio

from ..asyncio_bridge import BridgeMode, UserCodeRunner, runner_factory

T = TypeVar("T")


class HostLoopRunner(UserCodeRunner):
    """Runs a guest run's asyncio calls as tasks of the host loop.

    Args:
        mode: see :data:`~trio_rl.asyncio_bridge.BridgeMode`.
        nursery: where the Trio tasks that asyncio code awaits run.
        loop: the host loop (the one the guest run was started in).
    """

    def __init__(self, mode: BridgeMode, nursery: trio.Nursery, *, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(mode, nursery)
        self._host = loop
        self._trio_nursery = nursery
        self._token = trio.lowlevel.current_trio_token()

    async def _bridged(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        self.bridged_calls += 1
        return await run_on_host(self._host, fn, *args, **kwargs)

    def trio_from_asyncio(self, method: Callable[..., Awaitable[T]], *args: Any) -> Awaitable[T]:
        """A host-loop future of ``method(*args)`` run as a Trio task; cancelling the future cancels the task."""
        future: asyncio.Future[T] = self._host.create_future()
        scope = trio.CancelScope()

        async def run() -> None:
            with scope:
                try:
                    value = await method(*args)
                except Exception as exc:  # the asyncio awaiter gets it; Cancelled and the like end the run
                    if not future.done():
                        future.set_exception(exc)
                else:
                    if not future.done():
                        future.set_result(value)
            if not future.done():  # cancelled, by the awaiter or with the whole run
                future.cancel()

        def on_done(done: asyncio.Future[T]) -> None:
            if done.cancelled():
                self._token.run_sync_soon(scope.cancel)

        future.add_done_callback(on_done)
        self._token.run_sync_soon(self._trio_nursery.start_soon, run)
        return future


async def run_on_host(
    loop: asyncio.AbstractEventLoop, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any
) -> T:
    """Await ``fn(*args, **kwargs)`` as a task of the host loop, from a Trio task of the guest run.

    The coroutine is created inside the task, so even its first line sees a running
    asyncio loop and ``asyncio.current_task()``. It runs in a copy of the caller's
    context (as ``asyncio.create_task`` does).

    Raises:
        trio.Cancelled: when the caller is cancelled, once the task it cancelled has ended.
        Exception: whatever the task raised, as itself.
    """
    finished = trio.Event()
    token = trio.lowlevel.current_trio_token()

    async def body() -> T:
        return await fn(*args, **kwargs)

    task = loop.create_task(body())

    def wake(_: asyncio.Future[T]) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(finished.set)

    task.add_done_callback(wake)
    try:
        await finished.wait()
    except trio.Cancelled:
        task.cancel()
        with trio.CancelScope(shield=True):
            await finished.wait()
        raise
    return task.result()


class _HostCancelledError(Exception):
    """The guest run ended because the asyncio task that awaited it was cancelled."""


class _GuestControl:
    """How the host side cancels a guest run (through its Trio token, once the run has one)."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.token: trio.lowlevel.TrioToken | None = None
        self.cancel_requested = False

    def cancel(self) -> None:
        self.cancel_requested = True
        if self.token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self.token.run_sync_soon(self.scope.cancel)


async def run_as_guest(
    async_fn: Callable[..., Coroutine[Any, Any, T]], *args: Any, host_uses_signal_set_wakeup_fd: bool = True
) -> T:
    """From asyncio, run ``async_fn(*args)`` under Trio as a guest of the running loop, and return its result.

    Inside, trio_rl runs asyncio-flavoured user code on this loop (:class:`HostLoopRunner`).
    Cancelling the awaiting asyncio task (Ctrl-C under ``asyncio.run``) cancels the Trio
    run and waits for it to end; then ``asyncio.CancelledError`` is raised, unless the
    run failed with an error of its own on the way out, which is raised instead.

    Raises:
        BaseException: what ``async_fn`` raised, as itself.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[outcome.Outcome[T]] = loop.create_future()
    control = _GuestControl()

    async def guest() -> T:
        control.token = trio.lowlevel.current_trio_token()
        with control.scope:
            if control.cancel_requested:
                control.scope.cancel()
            return await async_fn(*args)
        raise _HostCancelledError

    def finished(result: outcome.Outcome[T]) -> None:
        if not done.done():
            done.set_result(result)

    context = contextvars.copy_context()
    context.run(runner_factory.set, _host_runner_factory(loop))
    context.run(
        trio.lowlevel.start_guest_run,
        guest,
        run_sync_soon_threadsafe=loop.call_soon_threadsafe,
        run_sync_soon_not_threadsafe=loop.call_soon,
        done_callback=finished,
        host_uses_signal_set_wakeup_fd=host_uses_signal_set_wakeup_fd,
    )
    try:
        result = await asyncio.shield(done)
    except asyncio.CancelledError:
        # A guest run must not outlive the task that started it: end it, then report.
        control.cancel()
        await _wait_uncancellable(done)
        ended = done.result()
        if isinstance(ended, outcome.Error) and not isinstance(ended.error, _HostCancelledError):
            ended.unwrap()
        raise
    return result.unwrap()


async def _wait_uncancellable(done: asyncio.Future[Any]) -> None:
    while not done.done():
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            continue


def _host_runner_factory(loop: asyncio.AbstractEventLoop) -> Callable[[BridgeMode, trio.Nursery], UserCodeRunner]:
    def make(mode: BridgeMode, nursery: trio.Nursery) -> UserCodeRunner:
        return HostLoopRunner(mode, nursery, loop=loop)

    return make
