"""The newest sampling client, shared by the trainer (writer) and the rollouts (readers)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import trio

from ..backends.protocol import SamplingClient


@dataclass(frozen=True)
class LatestWeightsStatistics:
    """What :meth:`LatestWeights.statistics` returns.

    Attributes:
        version: the newest published version (-1 before the first).
        tasks_waiting: tasks waiting in :meth:`LatestWeights.wait_for` for a newer version.
        expiring_scopes: rollouts' scopes waiting to be cancelled when their weights go stale.
        giving_up: whether every such rollout is being given up (the end of a "requeue" run).
    """

    version: int
    tasks_waiting: int
    expiring_scopes: int
    giving_up: bool


class LatestWeights:
    """Holds the newest published sampling client and its weights version.

    Version ``v`` means "the weights after ``v`` training steps". Readers wait for
    a version with a fresh :class:`trio.Event` per publication: publishing sets
    the current event and swaps in a new one, so no waiter can miss a version
    and no event is ever reused. The trainer is the only writer.
    """

    def __init__(self) -> None:
        self._version = -1
        self._client: SamplingClient | None = None
        self._published = trio.Event()
        self._expiring: dict[int, list[trio.CancelScope]] = defaultdict(list)
        self._giving_up = False

    @property
    def version(self) -> int:
        """The newest published version (-1 before the first)."""
        return self._version

    def statistics(self) -> LatestWeightsStatistics:
        """The version, and who waits on it, as Trio's primitives report themselves."""
        return LatestWeightsStatistics(
            version=self._version,
            tasks_waiting=self._published.statistics().tasks_waiting,
            expiring_scopes=sum(len(scopes) for scopes in self._expiring.values()),
            giving_up=self._giving_up,
        )

    def publish(self, version: int, client: SamplingClient) -> None:
        """Make ``client`` the newest; ``version`` must exceed every earlier one."""
        if version <= self._version:
            raise ValueError(f"version {version} published after version {self._version}")
        self._version, self._client = version, client
        for due in [v for v in self._expiring if v <= version]:
            for scope in self._expiring.pop(due):
                scope.cancel()
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

    def cancel_at(self, version: int, scope: trio.CancelScope) -> None:
        """Cancel ``scope`` when ``version`` is published (at once if it already is).

        Lets a rollout be given up the moment its weights become too stale,
        without a task per rollout watching the version.
        """
        if self._version >= version or self._giving_up:
            scope.cancel()
        else:
            self._expiring[version].append(scope)

    def give_up_all(self) -> None:
        """Cancel every scope passed to :meth:`cancel_at`, now and from now on, whatever its version.

        The end of a "requeue" run: the rollouts still running will not be waited for.
        """
        self._giving_up = True
        for scopes in self._expiring.values():
            for scope in scopes:
                scope.cancel()
        self._expiring.clear()
