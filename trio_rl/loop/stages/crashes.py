"""Telling a stage's crash from a cancellation, as the trainer must when it is cancelled."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any


class Crashes:
    """Whether a stage of the run crashed, as the stages around the trainer are watched for it.

    A crash cancels the trainer as a cancel from outside does, and Trio's
    nursery cancels its own scope in both cases (a child leaving with
    ``Cancelled`` counts), so only the stages' own exits tell them apart.
    """

    def __init__(self) -> None:
        self.seen = False

    async def watch(self, stage: Coroutine[Any, Any, None]) -> None:
        """Run ``stage``, noting whether it ended in an error (rather than a cancellation)."""
        try:
            await stage
        except BaseException as exc:
            if _has_error(exc):
                # Set before the error reaches the nursery, so before the trainer is cancelled.
                self.seen = True
            raise


def _has_error(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_has_error(e) for e in exc.exceptions)
    return isinstance(exc, Exception)
