"""Making tinker SDK requests from Trio: deadlines, blocking calls, pending results.

Shared by the Tinker clients (:mod:`._tinker_samplers`, :mod:`._tinker_training`) and
:class:`~trio_rl.backends.tinker.TinkerBackend`; the waiting itself is
:mod:`._future_bridge`'s.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import trio

from ._future_bridge import SDKFuture, await_future, is_sdk_future, remote_deadline

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class TinkerTimeouts:
    """How long each kind of remote wait may take, in seconds.

    A deadline covers one wait: from the moment the caller starts waiting (for a
    training request, ``await pending.result()``) until the answer arrives. Requests
    of one training client run in order, so the wait for an ``optim_step`` includes
    the ``forward_backward`` submitted before it.

    The defaults are generous, to cover a busy service; lower them to fail faster.
    """

    create_training_client: float = 900.0
    """Creating a training client; the service may first wait for capacity."""
    forward_backward: float = 600.0
    optim_step: float = 600.0
    sample: float = 600.0
    """One ``sample`` or ``compute_logprobs`` request."""
    checkpoint: float = 600.0
    """``save_state``, ``save_weights_for_sampler`` (snapshot or in-flight), ``load_state``, creating a sampling
    client."""
    tokenizer: float = 300.0
    """``get_tokenizer``, which may download the tokenizer."""
    close: float = 30.0
    """Finishing the session when the backend built its own service client."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or math.isnan(value) or value <= 0:
                raise ValueError(f"TinkerTimeouts.{field.name} must be a positive number, got {value!r}")


async def call_blocking(fn: Callable[[], Any], *, what: str, timeout: float, server: str | None = None) -> Any:
    """Run a blocking SDK call in a thread and, if it returned a future, await that too.

    One deadline covers both parts. On expiry or cancellation the thread is abandoned:
    it cannot be interrupted, and whatever it returns later is dropped.
    """
    with remote_deadline(what, timeout, server):
        value = await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
        if is_sdk_future(value):
            value = await await_future(value, what=what, timeout=None)
        return value


class TinkerPendingResult(Generic[T]):
    """A submitted Tinker request; :meth:`result` waits for it (a ``PendingResult``)."""

    def __init__(self, future: SDKFuture[T], *, what: str, timeout: float, server: str | None = None) -> None:
        self._future = future
        self._what = what
        self._timeout = timeout
        self._server = server

    async def result(self) -> T:
        """Wait for the answer; a cancelled wait leaves the request in place and may be resumed.

        Returns:
            The SDK's response.

        Raises:
            RemoteTimeoutError: if no answer came within the configured timeout;
                the request is then cancelled where possible.
            Exception: the SDK's exception for this request, unchanged.
        """
        return await await_future(
            self._future, what=self._what, timeout=self._timeout, withdraw_on_cancel=False, server=self._server
        )


class SDKClientWrapper:
    """An SDK client with the deadlines of its requests and the server named when one is missed."""

    def __init__(self, sdk_client: Any, *, timeouts: TinkerTimeouts, server: str | None = None) -> None:
        """Wrap an SDK client.

        Args:
            sdk_client: A ``tinker.TrainingClient`` or ``tinker.SamplingClient``.
            timeouts: Deadlines for its requests.
            server: The server's URL, named when a deadline is missed.
        """
        self._client = sdk_client
        self._timeouts = timeouts
        self._server = server

    @property
    def sdk_client(self) -> Any:
        """The underlying SDK client, for what the protocol does not cover."""
        return self._client

    async def _wait(self, future: SDKFuture[Any], what: str, timeout: float) -> Any:
        """The answer to a submitted request, within ``timeout``; cancelling the wait withdraws it."""
        return await await_future(future, what=what, timeout=timeout, server=self._server)

    async def _blocking(self, fn: Callable[[], Any], what: str, timeout: float) -> Any:
        """:func:`call_blocking` against this client's server."""
        return await call_blocking(fn, what=what, timeout=timeout, server=self._server)
