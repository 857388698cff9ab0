"""Deadlines on the tinker SDK's futures, for tests that drive the SDK directly.

The SDK retries some server errors without end (skyrl answers 500 for a result
it cannot serialise, which the SDK takes as transient), so an unbounded
``.result()`` can hang a whole test run. Every remote wait in the raw-SDK tests
goes through :func:`bounded_result`.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import pytest

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

CALL_TIMEOUT_S = 120.0
"""Default bound on one remote call; first calls of a shape include JAX compilation (~5 s)."""


class Waitable(Protocol[T_co]):
    """``concurrent.futures.Future`` and tinker's ``APIFuture`` alike."""

    def result(self, timeout: float | None = None) -> T_co:
        """Block for the value, at most ``timeout`` seconds."""
        ...


def bounded_result(future: Waitable[T], what: str, timeout_s: float = CALL_TIMEOUT_S) -> T:
    """``future.result()`` with a deadline; on timeout fail the test naming ``what``.

    Args:
        future: an SDK future.
        what: the call, for the failure message (``"forward_backward(ppo)"``).
        timeout_s: the deadline in seconds.

    Returns:
        The future's value.
    """
    try:
        return future.result(timeout=timeout_s)
    except TimeoutError:
        # Stop the SDK from retrying in the background for the rest of the run.
        inner = getattr(future, "future", None)
        target = inner() if callable(inner) else future
        cancel = getattr(target, "cancel", None)
        if callable(cancel):
            cancel()
        pytest.fail(f"{what}: no answer from the server within {timeout_s:.0f} s")
