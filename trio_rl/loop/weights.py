"""The newest sampling client, shared by the trainer (writer) and the rollouts (readers)."""

from __future__ import annotations

from collections.abc import Callable

import trio

from ..backends.protocol import SamplingClient


class LatestWeights:
    """Holds the newest published sampling client and its weights version.

    Version ``v`` means "the weights after ``v`` training steps". Readers wait for
    a version with a fresh :class:`trio.Event` per publication: publishing sets
    the current event and swaps in a new one, so no waiter can miss a version
    and no event is ever reused. The trainer is the only writer.

    Args:
        on_publish: told each version as it is published, before any waiter
            wakes (a run that resamples gives up its stale rollouts there).
    """

    def __init__(self, on_publish: Callable[[int], None] | None = None) -> None:
        self._version = -1
        self._client: SamplingClient | None = None
        self._published = trio.Event()
        self._on_publish = on_publish

    @property
    def version(self) -> int:
        """The newest published version (-1 before the first)."""
        return self._version

    def publish(self, version: int, client: SamplingClient) -> None:
        """Make ``client`` the newest; ``version`` must exceed every earlier one."""
        if version <= self._version:
            raise ValueError(f"version {version} published after version {self._version}")
        self._version, self._client = version, client
        if self._on_publish is not None:
            self._on_publish(version)
        published, self._published = self._published, trio.Event()
        published.set()

    def advance(self, version: int) -> None:
        """Publish ``version`` with unchanged weights (a step that trained nothing)."""
        _, client = self.latest()
        self.publish(version, client)

    def latest(self) -> tuple[int, SamplingClient]:
        """The newest version and its client."""
        if self._client is None:
            raise RuntimeError("no weights have been published yet")
        return self._version, self._client

    async def wait_for(self, version: int) -> None:
        """Return once a version at least ``version`` has been published."""
        while self._version < version:
            await self._published.wait()
