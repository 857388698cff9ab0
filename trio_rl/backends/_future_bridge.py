"""Await the tinker SDK's futures from Trio, without a thread per wait, and with a deadline.

The tinker SDK runs every request on one daemon thread of its own, inside an asyncio
event loop. Its submit methods return at once with a ``concurrent.futures.Future`` (or
an ``APIFuture`` whose ``.future()`` gives one) that the SDK's thread completes later.
Its ``result_async()`` and ``await api_future`` need a *running asyncio loop* and fail
under Trio; ``.result()`` blocks the whole Trio run. This module waits the Trio way:

1. ``fut.add_done_callback(cb)``. The SDK's thread calls ``cb`` when the future
   finishes (or the caller's thread calls it at once, if it already has).
2. ``cb`` only does ``token.run_sync_soon(done.set)``: it hands the wake-up to the Trio
   run and returns. It never blocks, so it cannot stall the SDK's event loop. If the
   Trio run has already ended, ``run_sync_soon`` raises ``trio.RunFinishedError``;
   ``cb`` swallows it, because nobody is left to wake and an exception raised in the
   SDK's thread would only be logged there as noise.
3. The waiting task sleeps in ``await done.wait()``, then reads ``fut.result()``, which
   returns the value or raises the SDK's own exception unchanged.

A thousand pending requests are a thousand sleeping Trio tasks and a thousand
callbacks; no thread is started. If the waiting task is cancelled, it calls
``fut.cancel()``: the SDK then cancels the request on its loop, where that is still
possible, and nothing is left waiting on the Trio side.

Every remote wait also has a deadline (:func:`remote_deadline`). The SDK retries some
server failures forever (a 500 on a bad token id, for one), so without a deadline a
run can hang with no error at all. On expiry the wait raises
:class:`RemoteTimeoutError`, whose message names the call and the time waited.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
from collections.abc import Generator
from typing import Protocol, TypeAlias, TypeVar, cast

import trio

T = TypeVar("T")


class RemoteTimeoutError(TimeoutError):
    """A remote call did not complete before its deadline.

    Attributes:
        what: The name of the call, such as ``"forward_backward"``.
        timeout: The seconds it was given.
        server: The server it was sent to, when known (a dead or stuck server
            is the usual cause: the SDK retries an unreachable one without end).
    """

    def __init__(self, what: str, timeout: float, server: str | None = None) -> None:
        # repr: 120.0 reads "120.0", 0.05 reads "0.05".
        message = f"{what} did not complete within {float(timeout)!r} s"
        if server is not None:
            message += f" on the Tinker server at {server} (is it down or overloaded?)"
        super().__init__(message)
        self.what = what
        self.timeout = timeout
        self.server = server

    def __reduce__(self) -> tuple[type[RemoteTimeoutError], tuple[str, float, str | None]]:
        # Rebuild from its fields, not from the message, e.g. across processes.
        return (type(self), (self.what, self.timeout, self.server))


class SupportsFuture(Protocol[T]):
    """Anything with a ``future()`` method, like the SDK's ``APIFuture``."""

    def future(self) -> concurrent.futures.Future[T]: ...  # pragma: no cover


#: What :func:`await_future` accepts: a standard future, or an ``APIFuture``-like object.
SDKFuture: TypeAlias = concurrent.futures.Future[T] | SupportsFuture[T]


def is_sdk_future(obj: object) -> bool:
    """Whether ``obj`` is something :func:`await_future` can wait for.

    Args:
        obj: Any value an SDK call returned.

    Returns:
        True for a ``concurrent.futures.Future`` and for anything with a ``future()``
        method (every ``APIFuture`` the SDK hands out).
    """
    # Look the method up on the type: some SDK wrappers forward unknown instance
    # attributes to the value they wrap, which would make every name look present.
    return isinstance(obj, concurrent.futures.Future) or callable(getattr(type(obj), "future", None))


def as_concurrent_future(obj: SDKFuture[T]) -> concurrent.futures.Future[T]:
    """The ``concurrent.futures.Future`` behind an SDK future.

    ``.future()`` is preferred even when ``obj`` is itself a ``concurrent.futures.Future``:
    tinker 0.38 returns a compatibility wrapper that is both, and whose own ``Future``
    methods emit a deprecation warning on every use.

    Args:
        obj: A ``concurrent.futures.Future`` or an object with a ``future()`` method.

    Returns:
        The underlying ``concurrent.futures.Future``.

    Raises:
        TypeError: if ``obj`` offers no ``concurrent.futures.Future``; such a future
            can only be awaited from asyncio, which trio_rl does not run.
    """
    future_method = getattr(type(obj), "future", None)
    if callable(future_method):
        inner: object = obj.future()  # type: ignore[union-attr]
        if isinstance(inner, concurrent.futures.Future):
            return cast("concurrent.futures.Future[T]", inner)
    if isinstance(obj, concurrent.futures.Future):
        return obj
    raise TypeError(
        f"cannot await {type(obj).__name__} from Trio: it has no concurrent.futures.Future "
        "(no .future() method), and its asyncio-only result_async() does not work under Trio"
    )


@contextlib.contextmanager
def remote_deadline(what: str, timeout: float | None, server: str | None = None) -> Generator[None, None, None]:
    """Give the enclosed remote wait ``timeout`` seconds, then fail with a clear error.

    Args:
        what: The name of the call, used in the error message.
        timeout: Seconds allowed, or ``None`` for no deadline.
        server: The server called, named in the error message when given.

    Raises:
        RemoteTimeoutError: if the deadline passed before the enclosed block finished.
        ValueError: if ``timeout`` is negative or NaN.
    """
    if timeout is None:
        yield
        return
    if math.isnan(timeout) or timeout < 0:
        raise ValueError(f"timeout for {what} must be >= 0, got {timeout!r}")
    with trio.move_on_after(timeout) as scope:
        yield
    if scope.cancelled_caught:
        raise RemoteTimeoutError(what, timeout, server)


async def await_future(
    fut: SDKFuture[T], *, what: str, timeout: float | None, withdraw_on_cancel: bool = True, server: str | None = None
) -> T:
    """Wait for an SDK future from Trio, with a deadline, without blocking the run.

    Args:
        fut: A ``concurrent.futures.Future``, or an ``APIFuture``-like object with a
            ``future()`` method.
        what: The name of the call, for the timeout message (``"forward_backward"``).
        timeout: Seconds to wait before giving up, or ``None`` to wait forever.
        withdraw_on_cancel: whether a wait cancelled from outside also cancels the
            future. False for training requests: once submitted they are not taken
            back, and the wait may be resumed, for example to save a consistent
            state after Ctrl-C. Reaching ``timeout`` always cancels the future.
        server: The server called, named in a timeout's message when given.

    Returns:
        The future's result.

    Raises:
        RemoteTimeoutError: if ``timeout`` passed first; the future is then cancelled.
        TypeError: if ``fut`` offers no ``concurrent.futures.Future``.
        concurrent.futures.CancelledError: if someone else cancelled the future.
        Exception: whatever the SDK completed the future with, unchanged.
    """
    cf = as_concurrent_future(fut)
    try:
        with remote_deadline(what, timeout, server):
            return await _wait_done(cf, withdraw_on_cancel)
    except RemoteTimeoutError:
        cf.cancel()
        raise


async def _wait_done(cf: concurrent.futures.Future[T], withdraw_on_cancel: bool) -> T:
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()

    def wake(_: concurrent.futures.Future[T]) -> None:
        # Runs in the SDK's thread: hand over and return, never block or raise.
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    cf.add_done_callback(wake)
    try:
        await done.wait()
    except BaseException:
        # Cancelled (or interrupted): nobody will read the answer, so withdraw the
        # request where the SDK still can. If it already finished, this is a no-op.
        if withdraw_on_cancel:
            cf.cancel()
        raise
    return cf.result()
