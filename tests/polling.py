"""Waiting, in real time, for a condition that another thread makes true."""

from __future__ import annotations

from collections.abc import Callable

import trio


async def wait_until(condition: Callable[[], bool], *, poll: float = 0.002) -> None:
    """Return once ``condition()`` is true, checking every ``poll`` seconds.

    Polled: the SDK stand-ins change what ``condition`` reads on threads of their
    own, which cannot set a ``trio.Event``. Callers bound it with ``trio.fail_after``.
    """
    while not condition():  # noqa: ASYNC110
        await trio.sleep(poll)
