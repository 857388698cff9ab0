"""What an entered ``LocalBackend`` shares with its clients."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

NOT_ENTERED = (
    "the LocalBackend is not entered: run code that samples or trains inside "
    "`async with backend:` (its background tasks live in that block)"
)


class BackendRuntime:
    """The nursery, thread limiter, seed source and folders of one ``LocalBackend``.

    Args:
        log_dir: where checkpoints are written.
        seed: seeds the draws for unseeded requests and unseeded training clients.
        max_batch_rows: most sampled rows one engine decodes together.
    """

    def __init__(self, log_dir: Path, seed: int, max_batch_rows: int) -> None:
        self.log_dir = log_dir
        self.rng = random.Random(seed)
        self.max_batch_rows = max_batch_rows
        # One torch job at a time: torch already uses every core inside a job,
        # and two jobs at once would only fight over them.
        self.limiter = trio.CapacityLimiter(1)
        self.nursery: trio.Nursery | None = None

    def require_entered(self) -> None:
        """Raise ``RuntimeError`` unless the backend's ``async with`` block is active."""
        if self.nursery is None:
            raise RuntimeError(NOT_ENTERED)

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Start ``fn`` as a task in the backend's nursery.

        Raises:
            RuntimeError: if the backend is not entered.
        """
        if self.nursery is None:
            raise RuntimeError(NOT_ENTERED)
        self.nursery.start_soon(fn)
