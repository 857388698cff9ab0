"""How an in-process training client makes its sampling clients: pinned snapshots, and its in-flight engine.

A snapshot client gets an engine of its own over a frozen copy of the weights.
In-flight clients share one engine per training client: the first
``save_weights_for_sampler(..., inflight=True)`` makes it, and each later one
publishes its weights to it (:meth:`~.batching.BatchingEngine.publish`), which
swaps them in between decode steps and drops the old ones. A weights version
is the number of ``optim_step`` calls the client has run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Generic, TypeVar

from trio_rl.backends.local.batching import BatchingEngine
from trio_rl.backends.local.optimizer import AdamState

SamplerT = TypeVar("SamplerT")


class SamplerSource(Generic[SamplerT]):
    """The sampling clients of a training client; a subclass supplies the model side (worker thread).

    Subclasses set ``self._adam`` (whose ``step`` is the weights version).
    """

    _adam: AdamState
    _inflight: BatchingEngine[Any] | None = None
    """The engine shared by every in-flight sampling client, once there is one."""

    def _freeze(self) -> Any:
        """A frozen copy of the current weights, for a sampling engine to read."""
        raise NotImplementedError

    def _engine(self, weights: Any, *, inflight: bool, version: int) -> BatchingEngine[Any]:
        """A sampling engine over ``weights`` (from :meth:`_freeze`)."""
        raise NotImplementedError

    def _save_sampler(self, path: Path) -> None:
        """Write the current weights to ``path`` as a sampler's folder."""
        raise NotImplementedError

    def _client(self, engine: BatchingEngine[Any], path: str | None) -> SamplerT:
        """The sampling client of ``engine``, whose weights were saved at ``path``."""
        raise NotImplementedError

    def _sampler(self, path: Path | None) -> SamplerT:
        """A sampling client pinned to a frozen copy of the weights, saved to ``path`` if given."""
        engine = self._engine(self._freeze(), inflight=False, version=self._adam.step)
        if path is not None:
            self._save_sampler(path)
        return self._client(engine, None if path is None else str(path))

    def _publish(self, path: Path) -> SamplerT:
        """Save the weights to ``path``, make them the in-flight weights, and return an in-flight client."""
        self._save_sampler(path)
        weights, version = self._freeze(), self._adam.step
        if self._inflight is None:
            self._inflight = self._engine(weights, inflight=True, version=version)
        else:
            self._inflight.publish(weights, version)
        return self._client(self._inflight, str(path))
