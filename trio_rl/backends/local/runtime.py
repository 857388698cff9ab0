"""What an entered ``LocalBackend`` shares with its clients."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

import torch
import trio

from trio_rl.backends.local.prefix_cache import DEFAULT_MAX_BYTES

NOT_ENTERED = (
    "the LocalBackend is not entered: run code that samples or trains inside "
    "`async with backend:` (its background tasks live in that block)"
)


@dataclass(frozen=True, kw_only=True)
class EngineSettings:
    """How an in-process backend's sampling engines batch, cache prompts and take in-flight weights.

    ``LocalBackend(engine=...)`` and ``HFBackend(engine=...)`` take one.

    Attributes:
        max_batch_rows: most samples one sampling client decodes in one batch.
        prefix_cache_bytes: bound of each sampling client's cache of prefilled
            prompts (a prompt prefills only what follows the longest prefix
            of it that the cache holds); ``0`` keeps none.
        inflight_recompute_kv: with in-flight weights, whether running
            requests recompute their keys and values under newly published
            weights (one prefill pass) instead of keeping them, as Tinker does
            (the default). Then each token's logprob is exactly a fresh forward
            pass of the weights that produced it.

    Raises:
        ValueError: for ``max_batch_rows`` below 1 or a negative ``prefix_cache_bytes``.
    """

    max_batch_rows: int = 256
    prefix_cache_bytes: int = DEFAULT_MAX_BYTES
    inflight_recompute_kv: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_rows < 1:
            raise ValueError(f"max_batch_rows must be at least 1, got {self.max_batch_rows}")
        if self.prefix_cache_bytes < 0:
            raise ValueError(f"prefix_cache_bytes must not be negative, got {self.prefix_cache_bytes}")


class BackendRuntime:
    """The nursery, thread limiter, seed source and folders of one ``LocalBackend``.

    Args:
        log_dir: where checkpoints are written.
        seed: seeds the draws for unseeded requests and unseeded training clients.
        engine: how its sampling engines batch, cache and take in-flight weights.
    """

    def __init__(self, log_dir: Path, seed: int, engine: EngineSettings) -> None:
        self.log_dir = log_dir
        self.rng = random.Random(seed)
        self.max_batch_rows = engine.max_batch_rows
        self.prefix_cache_bytes = engine.prefix_cache_bytes
        self.inflight_recompute_kv = engine.inflight_recompute_kv
        # One torch job at a time: torch already uses every core inside a job,
        # and two jobs at once would only fight over them.
        self.limiter = trio.CapacityLimiter(1)
        self.nursery: trio.Nursery | None = None
        self._nursery_manager: AbstractAsyncContextManager[trio.Nursery] | None = None
        self._saved_threads: int | None = None

    async def enter(self, num_threads: int | None) -> None:
        """Open the nursery and set torch's thread count (the backend's ``__aenter__``).

        Raises:
            RuntimeError: if already entered.
        """
        if self._nursery_manager is not None:
            raise RuntimeError("this backend is already entered")
        manager = trio.open_nursery()
        self.nursery = await manager.__aenter__()
        self._nursery_manager = manager
        if num_threads is not None:
            self._saved_threads = torch.get_num_threads()
            torch.set_num_threads(num_threads)

    async def exit(self, body_error: BaseException | None = None) -> None:
        """Cancel the background tasks, wait for them, restore torch's thread count.

        Args:
            body_error: what the ``async with`` block is exiting with; a failure
                while closing is then raised beside it, never instead of it.
        """
        manager, nursery = self._nursery_manager, self.nursery
        assert manager is not None and nursery is not None, "exit without enter"
        self._nursery_manager = None
        self.nursery = None
        nursery.cancel_scope.cancel()
        # The body's own exception is not handed to the nursery: it propagates
        # unchanged instead of coming out wrapped in an ExceptionGroup.
        try:
            await manager.__aexit__(None, None, None)
        except Exception as teardown:
            if not isinstance(body_error, Exception):
                raise
            raise ExceptionGroup(
                "the backend's block failed, then closing it failed too", [body_error, teardown]
            ) from None
        finally:
            if self._saved_threads is not None:
                torch.set_num_threads(self._saved_threads)
                self._saved_threads = None

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


class InProcessBackend:
    """What the in-process backends share: ``async with`` opens and closes their runtime.

    Subclasses set ``self._runtime`` and ``self._num_threads`` in ``__init__``.
    """

    _runtime: BackendRuntime
    _num_threads: int | None

    @property
    def log_dir(self) -> Path:
        """Where checkpoints are written."""
        return self._runtime.log_dir

    def check_inflight_weights(self) -> None:
        """Never raises: in-process backends have in-flight weights (``save_weights_for_sampler(..., inflight=True)``)."""

    async def __aenter__(self) -> Self:
        await self._runtime.enter(self._num_threads)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        await self._runtime.exit(exc)
        return None
