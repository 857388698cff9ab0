"""Channel plumbing the stages share: ends closed only at the real end of data, sends that let a crash speak."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import trio

T = TypeVar("T")


async def send_downstream(channel: trio.MemorySendChannel[Any], value: Any) -> None:
    """Send ``value``; if the receivers are gone, let the crash that removed them speak.

    Receivers only disappear when a stage crashed, and the crash cancels the
    nursery. A checkpoint lets that cancellation arrive, so the run reports the
    crash rather than a ``BrokenResourceError`` beside it.
    """
    try:
        await channel.send(value)
    except trio.BrokenResourceError:
        await trio.lowlevel.checkpoint()
        raise


@contextmanager
def closed_unless_crashed(*channels: trio.abc.AsyncResource) -> Generator[None, None, None]:
    """Close ``channels`` when the block ends or is cancelled, but not when it raises.

    Closing is how the end of data travels downstream. A stage that crashed has
    not reached the end of its data: its channels stay open, so the stage
    downstream waits until the crash's cancellation reaches it instead of
    mistaking the crash for the end of data (and, say, training a partial step
    and saving it as final).
    """
    try:
        yield
    except Exception:
        raise
    except BaseException:
        _close_all(channels)
        raise
    else:
        _close_all(channels)


def _close_all(channels: Sequence[trio.abc.AsyncResource]) -> None:
    for channel in channels:
        channel.close()  # type: ignore[attr-defined]


def ready(channel: trio.MemoryReceiveChannel[T] | None) -> list[T]:
    """What ``channel`` holds now, without waiting."""
    taken: list[T] = []
    while channel is not None:
        try:
            taken.append(channel.receive_nowait())
        except trio.WouldBlock:
            break
    return taken
