"""The fake sampler model: a finite number of slots, per-token time, and a record of every sequence."""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, replace
from typing import Any

import trio

from ..base.determinism import settle
from .calls import ResponseLength
from .inflight import InflightWeights


@dataclass(frozen=True, kw_only=True)
class FakeSamplerModel:
    """How the fake backend's sampler produces responses.

    With the defaults a sample call takes the backend's ``sample_latency`` whatever it
    samples, any number of calls run at once, and each response has a random length
    in 1..``max_tokens``. Given ``slots``, ``token_latency`` or ``response_length``,
    sampling follows a finite sampler model instead (see :class:`~trio_rl.testing.FakeBackend`).

    Attributes:
        slots: how many responses the sampler produces at once (None: unlimited).
        token_latency: seconds each response holds its slot per token.
        response_length: ``fn(prompt_tokens, sample_index) -> int``, each response's length.
        vocab_size: sampled token ids lie in ``range(vocab_size)``.

    Raises:
        ValueError: for ``slots`` below 1 or a negative ``token_latency``.
    """

    slots: int | None = None
    token_latency: float = 0.0
    response_length: ResponseLength | None = None
    vocab_size: int = 32

    def __post_init__(self) -> None:
        if self.slots is not None and self.slots < 1:
            raise ValueError(f"FakeSamplerModel: slots must be at least 1 (or None for unlimited), got {self.slots}")
        if self.token_latency < 0:
            raise ValueError(f"FakeSamplerModel: token_latency must be >= 0 seconds, got {self.token_latency}")

    @property
    def modelled(self) -> bool:
        """Whether sampling follows the finite sampler model rather than the per-call latency alone."""
        return self.slots is not None or self.token_latency > 0 or self.response_length is not None


@dataclass(frozen=True)
class FakeSequence:
    """One response the fake sampler model produced, and when it held a slot.

    Token ``i`` (0-based) is produced at :meth:`token_time` ``(i)``, that is
    ``started + (i + 1) * token_latency``: a sequence's last token ends it, so
    ``ended == started + length * token_latency`` unless it was cancelled.

    Attributes:
        prompt: the prompt's tokens.
        sample_index: its index among the ``num_samples`` of its request.
        version: the weights version of the sampling client that asked for it.
        length: tokens in the response (``response_length``'s answer, capped at ``max_tokens``);
            a cancelled one produced only those whose :meth:`token_time` is at most ``ended``.
        requested: when it reached the sampler (after the call's ``sample_latency``).
        started: when it got a slot; ``started - requested`` is the time it queued.
        ended: when it gave its slot back: at its last token, or when it was cancelled.
        token_latency: seconds per token.
        cancelled: whether it was cancelled before its last token.
        token_versions: sampled on an in-flight client, the weights version of
            each token it produced (see :class:`FakeBackend`); None on a snapshot client.
    """

    prompt: tuple[int, ...]
    sample_index: int
    version: int
    length: int
    requested: float
    started: float
    ended: float
    token_latency: float
    cancelled: bool = False
    token_versions: tuple[int, ...] | None = None

    def token_time(self, index: int) -> float:
        """When token ``index`` (0-based) is produced.

        Raises:
            IndexError: for an index outside ``range(length)``.
        """
        if not 0 <= index < self.length:
            raise IndexError(f"token {index} of a {self.length}-token sequence")
        return self.started + (index + 1) * self.token_latency


def start_order(sequence: FakeSequence) -> tuple[Any, ...]:
    """How :attr:`FakeBackend.sequences` orders the sequences: by start, then queue order."""
    return (sequence.started, sequence.requested, sequence.prompt, sequence.sample_index, sequence.version)


class _SlotRequest:
    """One sequence waiting for a sampler slot; ``key`` orders it among the waiting ones."""

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key
        self.requested: float = key[0]
        self.started: float | None = None
        self.granted = trio.Event()
        self.withdrawn = False


class _FakeSlots:
    """``count`` sampler slots, handed out first come, first served.

    Requests that arrive at the same instant are ordered by their key (the
    prompt, sample index, version and seed), not by the order in which Trio
    happened to run their tasks: a request joins the queue only after
    :func:`~trio_rl.base.determinism.settle`, once every request of its instant
    has arrived. A slot freed later goes at once to the head of the queue, so the
    queue only ever holds requests of earlier instants and the order is the same
    whichever task frees the slot.
    """

    def __init__(self, count: int) -> None:
        self._free: list[float] = [-math.inf] * count
        """When each free slot became free (a heap). A request that finds one free
        starts at its own arrival, not after the settle that ranked it."""
        self._arriving: list[_SlotRequest] = []
        self._queue: list[tuple[tuple[Any, ...], int, _SlotRequest]] = []
        self._tiebreak = itertools.count()

    async def acquire(self, request: _SlotRequest) -> float:
        """Wait for a slot; return the time it was granted. On any exception the request leaves no trace."""
        self._arriving.append(request)
        try:
            await settle()
            self._enqueue_arrived(request.requested)
            self._dispatch()
            await request.granted.wait()
        except BaseException:
            if request.started is not None:
                self.release(trio.current_time())
            else:
                request.withdrawn = True
            raise
        assert request.started is not None
        return request.started

    def release(self, at: float) -> None:
        """Give a slot back, free since ``at``; the head of the queue, if any, takes it now."""
        heapq.heappush(self._free, at)
        self._dispatch()

    def _enqueue_arrived(self, until: float) -> None:
        # Only requests of this instant or earlier: one of a later instant waits
        # for its own settle, so its rank never depends on who ran first.
        still: list[_SlotRequest] = []
        for request in self._arriving:
            if request.withdrawn:
                continue
            if request.requested <= until:
                heapq.heappush(self._queue, (request.key, next(self._tiebreak), request))
            else:
                still.append(request)
        self._arriving = still

    def _dispatch(self) -> None:
        while self._free and self._queue:
            request = heapq.heappop(self._queue)[2]
            if request.withdrawn:
                continue
            request.started = max(request.requested, heapq.heappop(self._free))
            request.granted.set()


@dataclass(frozen=True)
class _Served:
    """One sample call as the sampler model serves it: the prompt, the client's weights version,
    the request's seed, and the in-flight weights its tokens come from (None on a snapshot client)."""

    prompt: tuple[int, ...]
    version: int
    seed: int | None
    inflight: InflightWeights | None


class SamplerModel:
    """The sampler model of :class:`FakeBackend`: slots, per-token time, and a record of every sequence."""

    def __init__(self, settings: FakeSamplerModel, record: bool) -> None:
        self.slots = None if settings.slots is None else _FakeSlots(settings.slots)
        self.token_latency = settings.token_latency
        self.record = record
        self.sequences: list[FakeSequence] = []

    async def serve(
        self,
        prompt: tuple[int, ...],
        lengths: list[int],
        version: int,
        seed: int | None,
        inflight: InflightWeights | None = None,
    ) -> list[tuple[int, ...] | None]:
        """Hold a slot for each sequence for its length in tokens; return when the last one ends.

        Returns:
            Per sequence, the version of each token (from ``inflight``), or None without it.
        """
        call = _Served(prompt, version, seed, inflight)
        versions: list[tuple[int, ...] | None] = [None] * len(lengths)
        if len(lengths) == 1:
            await self._hold(call, 0, lengths[0], versions)
            return versions
        async with trio.open_nursery() as nursery:
            for index, length in enumerate(lengths):
                nursery.start_soon(self._hold, call, index, length, versions)
        return versions

    async def _hold(self, call: _Served, index: int, length: int, versions: list[tuple[int, ...] | None]) -> None:
        prompt, version, seed, inflight = call.prompt, call.version, call.seed, call.inflight
        requested = trio.current_time()
        if self.slots is None:
            started = requested
        else:
            key = (requested, prompt, index, version, -1 if seed is None else seed)
            started = await self.slots.acquire(_SlotRequest(key))
        end = started + length * self.token_latency
        sequence = FakeSequence(prompt, index, version, length, requested, started, end, self.token_latency)
        position = len(self.sequences)
        if self.record:
            self.sequences.append(sequence)
        try:
            await trio.sleep_until(end)
        except BaseException:
            now = trio.current_time()
            if self.slots is not None:
                self.slots.release(now)
            if self.record:
                done = None
                if inflight is not None:
                    produced = sum(1 for i in range(length) if sequence.token_time(i) <= now)
                    done = inflight.token_versions(version, started, self.token_latency, produced)
                self.sequences[position] = replace(sequence, ended=now, cancelled=True, token_versions=done)
            raise
        # Free since its last token, even if this task woke a settle later.
        if self.slots is not None:
            self.slots.release(end)
        if inflight is not None:
            # Every publication before this sequence's last token has happened by now.
            versions[index] = inflight.token_versions(version, started, self.token_latency, length)
            if self.record:
                self.sequences[position] = replace(sequence, token_versions=versions[index])
