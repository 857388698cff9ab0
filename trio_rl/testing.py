"""Fakes for tests and benchmarks: a virtual-time backend and configurable fake envs.

:class:`FakeBackend` runs natively in Trio with no threads, so it works under
``trio.testing.MockClock`` (``autojump_clock`` in pytest-trio): every latency is a
``trio.sleep``. It is deterministic from its seed and records every call with
the weights version it saw, so tests can assert on order and staleness. Given
``sample_slots``, ``token_latency`` or ``response_length`` it also models a
sampler with a finite number of sequences in flight (see :class:`FakeBackend`),
which is what a long tail of response lengths costs a real one.

The fake envs (:class:`FakeEnv`, :class:`FakeEnvGroupBuilder`, :class:`FakeDataset`)
give rewards that depend on the sampled tokens, so groups have mixed rewards, and
can be told to fail or hang at a chosen point.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Self

import trio
from tinker import types as tinker_types

from . import _tinker_compat as compat
from .base.determinism import derive_seed, settle
from .types import (
    ActionExtra,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    RLDataset,
    StepResult,
    StopCondition,
    Trajectory,
)

Latency = float | Callable[[Any], float]
"""Seconds of virtual latency: a constant, or a function of the request."""


ResponseLength = Callable[[Sequence[int], int], int]
"""``fn(prompt_tokens, sample_index) -> int``: how many tokens one sampled response has."""


def _latency(latency: Latency, request: Any) -> float:
    return latency(request) if callable(latency) else latency


@dataclass(frozen=True)
class FakeCall:
    """One call the fake backend received.

    Attributes:
        kind: ``sample``, ``forward_backward``, ``optim_step``, ``save_weights_for_sampler``,
            ``save_state``, ``load_state`` or ``compute_logprobs``.
        time: ``trio.current_time()`` when it was received.
        version: the weights version it ran against.
        detail: call-specific facts (datum count, seed, ...).
    """

    kind: str
    time: float
    version: int
    detail: dict[str, Any] = field(default_factory=dict)


class FakeTokenizer:
    """Characters as token ids (their code points, modulo nothing)."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, tokens: Sequence[int]) -> str:
        return "".join(chr(t) for t in tokens)


def _fake_group_key(datum: tinker_types.Datum) -> tuple[int, int]:
    """The (batch, group) a fake env wrote into the first two prompt tokens.

    Other envs' data may be shorter (a one-token prompt answered in one token
    gives a one-token model input): a part it lacks reads -1.
    """
    tokens = datum.model_input.to_ints()[:2]
    batch = tokens[0] - 1 if len(tokens) > 0 else -1
    group = tokens[1] - 2 if len(tokens) > 1 else -1
    return (batch, group)


class _FakePending:
    def __init__(self, ready_at: float, value: Any, error: BaseException | None) -> None:
        self._ready_at = ready_at
        self._value = value
        self._error = error

    async def result(self) -> Any:
        await trio.sleep_until(self._ready_at)
        if self._error is not None:
            raise self._error
        return self._value


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


def _start_order(sequence: FakeSequence) -> tuple[Any, ...]:
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


class _InflightWeights:
    """A fake training client's in-flight weights: each version published in flight, and when.

    A token produced at time ``t`` comes from the newest version published
    before ``t``. A publication at the very instant a token is produced counts
    from the next token on: the token's version then never depends on which of
    the two tasks Trio ran first.
    """

    def __init__(self) -> None:
        self._times: list[float] = []
        self._versions: list[int] = []

    def publish(self, version: int) -> None:
        """Make ``version`` the in-flight weights from now on."""
        self._times.append(trio.current_time())
        self._versions.append(version)

    def token_versions(self, floor: int, started: float, spacing: float, count: int) -> tuple[int, ...]:
        """The versions of ``count`` tokens, token ``i`` produced at ``started + (i + 1) * spacing``.

        None is older than ``floor`` (the version of the client that asked).
        """
        if count <= 0:
            return ()

        def produced(i: int) -> float:
            # Exactly FakeSequence.token_time's arithmetic, so that tests compare equal floats.
            return started + (i + 1) * spacing

        start = bisect.bisect_left(self._times, produced(0))
        version = max(floor, self._versions[start - 1]) if start else floor
        out: list[int] = []
        for when, newer in zip(self._times[start:], self._versions[start:], strict=True):
            # The tokens produced up to ``when`` keep ``version``; the rest see ``newer``.
            kept = count if spacing <= 0 else min(count, max(len(out), math.floor((when - started) / spacing)))
            # The division may be off by one at a boundary: settle it on the token times themselves.
            while kept > len(out) and produced(kept - 1) > when:
                kept -= 1
            while kept < count and produced(kept) <= when:
                kept += 1
            out.extend([version] * (kept - len(out)))
            if kept == count:
                break
            version = max(floor, newer)
        out.extend([version] * (count - len(out)))
        return tuple(out)


class _FakeSampler:
    """The sampler model of :class:`FakeBackend`: slots, per-token time, and a record of every sequence."""

    def __init__(self, slots: int | None, token_latency: float, record: bool) -> None:
        self.slots = None if slots is None else _FakeSlots(slots)
        self.token_latency = token_latency
        self.record = record
        self.sequences: list[FakeSequence] = []

    async def serve(
        self,
        prompt: tuple[int, ...],
        lengths: list[int],
        version: int,
        seed: int | None,
        inflight: _InflightWeights | None = None,
    ) -> list[tuple[int, ...] | None]:
        """Hold a slot for each sequence for its length in tokens; return when the last one ends.

        Returns:
            Per sequence, the version of each token (from ``inflight``), or None without it.
        """
        versions: list[tuple[int, ...] | None] = [None] * len(lengths)
        if len(lengths) == 1:
            await self._hold(prompt, 0, lengths[0], version, seed, inflight, versions)
            return versions
        async with trio.open_nursery() as nursery:
            for index, length in enumerate(lengths):
                nursery.start_soon(self._hold, prompt, index, length, version, seed, inflight, versions)
        return versions

    async def _hold(
        self,
        prompt: tuple[int, ...],
        index: int,
        length: int,
        version: int,
        seed: int | None,
        inflight: _InflightWeights | None,
        versions: list[tuple[int, ...] | None],
    ) -> None:
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


class FakeSamplingClient:
    """Samples deterministic pseudo-random tokens from one weights version, or, in flight, from newer ones too.

    A snapshot client (the default) is pinned to ``version``. An in-flight one
    (from ``save_weights_for_sampler(..., inflight=True)``) produces each token
    from its training client's newest in-flight weights published before that
    token's time (:meth:`FakeSequence.token_time` under the sampler model, else
    the moment the request is served), never older than ``version``, and
    returns :class:`~trio_rl.backends.protocol.VersionedSequence` objects that
    say so. The fake tokens and logprobs themselves stay derived from
    ``version`` (the weights a request starts from): only the versions are
    modelled, not what newer weights would have sampled.
    """

    def __init__(
        self,
        backend: FakeBackend,
        version: int,
        model_path: str | None,
        inflight: _InflightWeights | None = None,
    ) -> None:
        self._backend = backend
        self.version = version
        self._model_path = model_path
        self._inflight = inflight

    @property
    def model_path(self) -> str | None:
        return self._model_path

    @property
    def inflight(self) -> bool:
        """Whether this client adopts in-flight weights published after it."""
        return self._inflight is not None

    async def sample(
        self, prompt: tinker_types.ModelInput, num_samples: int, sampling_params: tinker_types.SamplingParams
    ) -> tinker_types.SampleResponse:
        backend = self._backend
        backend._record("sample", self.version, seed=sampling_params.seed, prompt_len=compat.token_count(prompt))
        await trio.sleep(_latency(backend.sample_latency, (prompt, num_samples, sampling_params)))
        if backend.fail_sample is not None:
            raise backend.fail_sample
        # A seeded request depends on its seed, not on its prompt; an unseeded one
        # on its prompt (tuples of ints hash the same in every process).
        base = sampling_params.seed if sampling_params.seed is not None else hash(tuple(prompt.to_ints()))
        max_tokens = sampling_params.max_tokens or 16
        rngs = [random.Random(derive_seed(backend.seed, base, i, self.version)) for i in range(num_samples)]
        if backend.response_length is None:
            lengths = [rng.randint(1, max_tokens) for rng in rngs]
        else:
            prompt_tokens = prompt.to_ints()
            lengths = [backend._response_length(prompt_tokens, i, max_tokens) for i in range(num_samples)]
        inflight = self._inflight
        if backend._sampler is not None:
            versions = await backend._sampler.serve(
                tuple(prompt.to_ints()), lengths, self.version, sampling_params.seed, inflight
            )
        elif inflight is not None:
            # No sampler model: every token is produced the moment the request is served.
            now = trio.current_time()
            versions = [inflight.token_versions(self.version, now, 0.0, n) for n in lengths]
        else:
            versions = [None] * len(lengths)
        sequences = []
        for rng, n, token_versions in zip(rngs, lengths, versions, strict=True):
            tokens = rng.choices(range(backend.vocab_size), k=n)
            logprobs = [-3 * rng.random() for _ in range(n)]
            stop: tinker_types.StopReason = "stop" if n < max_tokens else "length"
            sequences.append(compat.sampled_sequence(tokens, logprobs, stop, token_versions=token_versions))
        return compat.sample_response(sequences)

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        backend = self._backend
        backend._record("compute_logprobs", self.version, prompt_len=prompt.length)
        await trio.sleep(_latency(backend.sample_latency, prompt))
        rng = random.Random(derive_seed(backend.seed, self.version, *prompt.to_ints()))
        # The first token has no logprob; an empty prompt has none at all.
        return [None, *(-rng.random() * 3 for _ in range(prompt.length - 1))][: prompt.length]


class FakeTrainingClient:
    """Processes requests in submission order, each after its virtual latency.

    The weights are just a version number: each ``optim_step`` adds one.
    """

    def __init__(self, backend: FakeBackend, version: int = 0) -> None:
        self._backend = backend
        self.version = version
        self._busy_until = -math.inf
        self._inflight = _InflightWeights()

    def _schedule(self, latency: float) -> float:
        # One request at a time, in submission order, as on the Tinker service.
        self._busy_until = max(self._busy_until, trio.current_time()) + latency
        return self._busy_until

    async def forward_backward(
        self,
        data: Sequence[tinker_types.Datum],
        loss_fn: tinker_types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
    ) -> _FakePending:
        backend = self._backend
        tokens = sum(compat.token_count(d.model_input) for d in data)
        if backend.record_calls:
            # A fake env's prompt starts with its group's identity (see FakeEnv).
            groups = sorted({_fake_group_key(d) for d in data})
            backend._record(
                "forward_backward", self.version, data=len(data), tokens=tokens, loss_fn=loss_fn, groups=groups
            )
        await trio.lowlevel.checkpoint()
        outputs = [{"logprobs": compat.tensor([-0.5] * compat.token_count(d.model_input), "float32")} for d in data]
        value = compat.forward_backward_output(outputs, {"loss:sum": float(tokens) * 0.5})
        ready = self._schedule(_latency(backend.train_latency, data))
        return _FakePending(ready, value, backend.fail_train)

    async def optim_step(self, adam_params: tinker_types.AdamParams) -> _FakePending:
        backend = self._backend
        backend._record("optim_step", self.version, learning_rate=adam_params.learning_rate)
        await trio.lowlevel.checkpoint()
        self.version += 1
        ready = self._schedule(_latency(backend.optim_latency, adam_params))
        return _FakePending(ready, tinker_types.OptimStepResponse(metrics={"lr": adam_params.learning_rate}), None)

    async def save_weights_for_sampler(self, name: str, *, inflight: bool = False) -> FakeSamplingClient:
        """Save the weights as ``name`` and return a sampling client for them, after ``save_latency``.

        With ``inflight``, they also become this client's in-flight weights the
        moment the save returns (the call's time plus its latency, queued behind
        earlier requests): every in-flight sampling client of this training
        client produces its later tokens from them. A save cancelled before it
        returns publishes nothing.
        """
        backend = self._backend
        backend._record("save_weights_for_sampler", self.version, name=name, inflight=inflight)
        # The weights as of the request, as the service processes requests in order.
        version = self.version if inflight else None
        await trio.sleep_until(self._schedule(_latency(backend.save_latency, name)))
        path = f"fake://sampler/{name}"
        if version is None:
            backend.samplers[path] = self.version
            return FakeSamplingClient(backend, self.version, path)
        backend.samplers[path] = version
        self._inflight.publish(version)
        return FakeSamplingClient(backend, version, path, self._inflight)

    async def save_state(self, name: str) -> str:
        backend = self._backend
        backend._record("save_state", self.version, name=name)
        await trio.sleep_until(self._schedule(_latency(backend.state_latency, name)))
        path = f"fake://state/{name}"
        backend.states[path] = self.version
        return path

    async def load_state(self, path: str, *, with_optimizer: bool = True) -> None:
        backend = self._backend
        if path not in backend.states:
            raise FileNotFoundError(f"no fake state saved at {path!r}")
        backend._record("load_state", self.version, path=path, with_optimizer=with_optimizer)
        await trio.lowlevel.checkpoint()
        self.version = backend.states[path]

    async def get_tokenizer(self) -> FakeTokenizer:
        return FakeTokenizer()


class FakeBackend:
    """A Trio-native backend with virtual latencies, for tests and benchmarks.

    By default a sample call takes ``sample_latency`` whatever it samples, and
    any number of calls run at once. Given ``sample_slots``, ``token_latency`` or
    ``response_length``, sampling follows a finite sampler model instead, as a
    real server behaves under a long tail of response lengths:

    - each response has ``response_length(prompt_tokens, sample_index)`` tokens
      (default: the random 1..``max_tokens`` of the default path), capped at the
      request's ``max_tokens``;
    - each response holds one of ``sample_slots`` slots (default: unlimited) for
      ``length * token_latency`` seconds, after the call's ``sample_latency``;
    - when every slot is busy it queues, first come first served; responses that
      arrive at the same instant are ordered by prompt, sample index, weights
      version and seed, so the order never depends on Trio's scheduling;
    - every response is recorded in :attr:`sequences` (when ``record_calls``).

    It has in-flight weights (``check_inflight_weights``): see
    :meth:`FakeTrainingClient.save_weights_for_sampler` and :class:`FakeSamplingClient`.

    Args:
        seed: makes every sampled token reproducible.
        sample_latency, train_latency, optim_latency, save_latency: seconds per
            call, or a function of the request returning seconds.
        state_latency: seconds per ``save_state`` (default: ``save_latency``).
        vocab_size: sampled token ids lie in ``range(vocab_size)``.
        record_calls: keep :attr:`calls` (and, with the sampler model, :attr:`sequences`).
        sample_slots: how many responses the sampler produces at once (None: unlimited).
        token_latency: seconds each response holds its slot per token.
        response_length: ``fn(prompt_tokens, sample_index) -> int``, each response's length.

    Attributes:
        calls: every call received, in order.
        fail_sample, fail_train: set to an exception to make those calls fail.

    Raises:
        ValueError: for ``sample_slots`` below 1 or a negative ``token_latency``.
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        sample_latency: Latency = 0.0,
        train_latency: Latency = 0.0,
        optim_latency: Latency = 0.0,
        save_latency: Latency = 0.0,
        state_latency: Latency | None = None,
        vocab_size: int = 32,
        record_calls: bool = True,
        sample_slots: int | None = None,
        token_latency: float = 0.0,
        response_length: ResponseLength | None = None,
    ) -> None:
        if sample_slots is not None and sample_slots < 1:
            raise ValueError(
                f"FakeBackend: sample_slots must be at least 1 (or None for unlimited), got {sample_slots}"
            )
        if token_latency < 0:
            raise ValueError(f"FakeBackend: token_latency must be >= 0 seconds, got {token_latency}")
        self.seed = seed
        self.sample_latency = sample_latency
        self.train_latency = train_latency
        self.optim_latency = optim_latency
        self.save_latency = save_latency
        self.state_latency = save_latency if state_latency is None else state_latency
        self.vocab_size = vocab_size
        self.record_calls = record_calls
        self.sample_slots = sample_slots
        self.token_latency = token_latency
        self.response_length = response_length
        self.calls: list[FakeCall] = []
        self.states: dict[str, int] = {}
        self.samplers: dict[str, int] = {}
        """The weights version of each sampler saved by name, for ``create_sampling_client``."""
        self.fail_sample: BaseException | None = None
        self.fail_train: BaseException | None = None
        modelled = sample_slots is not None or token_latency > 0 or response_length is not None
        self._sampler = _FakeSampler(sample_slots, token_latency, record_calls) if modelled else None

    @property
    def sequences(self) -> list[FakeSequence]:
        """Every response the sampler model produced, by start time (ties in queue order).

        Empty without the sampler model or with ``record_calls=False``.
        """
        if self._sampler is None:
            return []
        return sorted(self._sampler.sequences, key=_start_order)

    def _response_length(self, prompt_tokens: list[int], sample_index: int, max_tokens: int) -> int:
        assert self.response_length is not None
        length = self.response_length(prompt_tokens, sample_index)
        if length < 0:
            raise ValueError(
                f"FakeBackend: response_length returned {length} for sample {sample_index} "
                f"of prompt {prompt_tokens[:8]}...; a length must be >= 0"
            )
        return min(length, max_tokens)

    def _record(self, kind: str, version: int, **detail: Any) -> None:
        if self.record_calls:
            self.calls.append(FakeCall(kind, trio.current_time(), version, detail))

    def calls_of(self, kind: str) -> list[FakeCall]:
        """The recorded calls of one kind, in order."""
        return [c for c in self.calls if c.kind == kind]

    def check_inflight_weights(self) -> None:
        """The fake always has in-flight weights (``save_weights_for_sampler(..., inflight=True)``)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> FakeTrainingClient:
        await trio.lowlevel.checkpoint()
        return FakeTrainingClient(self)

    async def create_training_client_from_state(self, path: str, *, with_optimizer: bool = True) -> FakeTrainingClient:
        client = FakeTrainingClient(self)
        await client.load_state(path, with_optimizer=with_optimizer)
        return client

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> FakeSamplingClient:
        """A client for the initial weights (version 0), or for a saved sampler's version."""
        await trio.lowlevel.checkpoint()
        self._record("create_sampling_client", 0, base_model=base_model, model_path=model_path)
        return FakeSamplingClient(self, version=self.samplers.get(model_path or "", 0), model_path=model_path)


# ---------------------------------------------------------------- fake envs


FailPoint = str
"""Where a fake env fails: ``make_envs``, ``step``, ``compute_group_rewards`` or ``never``."""


@dataclass
class FakeEnvSpec:
    """How the fake envs of a dataset behave.

    Attributes:
        group_size: envs per group.
        turns: steps per episode; observations extend the previous turn's
            sequence, so multi-turn data merges into one Datum.
        step_latency: virtual seconds each ``env.step`` takes.
        fail_at: ``(batch, group)`` -> where that group fails.
        fail_attempts: how many rollout attempts of a failing group fail before
            one succeeds (``None``: all of them).
        hang_at: ``(batch, group)`` whose ``step`` never returns on the first attempt.
        error: the exception a failing fake env raises.
        constant_reward_groups: groups ``(batch, group)`` whose every env gets reward 1.0.
        failure_times: when each injected failure was raised (``trio.current_time()``).
    """

    group_size: int = 4
    turns: int = 1
    step_latency: float = 0.0
    fail_at: dict[tuple[int, int], FailPoint] = field(default_factory=dict)
    fail_attempts: int | None = None
    hang_at: set[tuple[int, int]] = field(default_factory=set)
    error: type[Exception] = RuntimeError
    constant_reward_groups: set[tuple[int, int]] = field(default_factory=set)
    failure_times: list[float] = field(default_factory=list)

    def fail(self, message: str) -> Exception:
        """Record the failure time and return the exception to raise."""
        self.failure_times.append(trio.current_time())
        return self.error(message)


class FakeEnv(Env):
    """Rewards the fraction of even tokens in each action; ``turns`` steps long."""

    def __init__(self, key: tuple[int, int], index: int, spec: FakeEnvSpec, attempt: int, log: list[str]) -> None:
        self.key = key
        self.index = index
        self.spec = spec
        self.attempt = attempt
        self.turn = 0
        self.tokens = [1 + key[0], 2 + key[1], 3 + index]
        self.log = log

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return compat.model_input_from_ints(list(self.tokens)), [0]

    async def step(self, action: list[int], *, extra: ActionExtra | None = None) -> StepResult:
        spec = self.spec
        failing = spec.fail_attempts is None or self.attempt < spec.fail_attempts
        if spec.fail_at.get(self.key) == "step" and failing and self.index == 0:
            raise spec.fail(f"fake env {self.key} failed in step")
        if self.key in spec.hang_at and self.attempt == 0 and self.index == 0:
            self.log.append(f"hang {self.key}")
            await trio.sleep_forever()
        if spec.step_latency:
            await trio.sleep(spec.step_latency)
        self.turn += 1
        self.tokens = self.tokens + list(action) + [5]
        reward = sum(1 for t in action if t % 2 == 0) / max(1, len(action))
        if self.key in spec.constant_reward_groups:
            reward = 1.0
        done = self.turn >= spec.turns
        return StepResult(
            reward=reward / spec.turns,
            episode_done=done,
            next_observation=compat.model_input_from_ints(list(self.tokens)),
            next_stop_condition=[0],
            metrics={"even_frac": reward},
        )


class FakeEnvGroupBuilder(EnvGroupBuilder):
    """A group of :class:`FakeEnv`; logs what happens to it in ``log``."""

    def __init__(self, key: tuple[int, int], spec: FakeEnvSpec, log: list[str], tags: Sequence[str] = ()) -> None:
        self.key = key
        self.spec = spec
        self.log = log
        self.tags = list(tags)
        self.attempts = 0
        self.retries = 0

    async def make_envs(self) -> Sequence[Env]:
        attempt = self.attempts
        self.attempts += 1
        failing = self.spec.fail_attempts is None or attempt < self.spec.fail_attempts
        if self.spec.fail_at.get(self.key) == "make_envs" and failing:
            raise self.spec.fail(f"fake group {self.key} failed in make_envs")
        self.log.append(f"make_envs {self.key}")
        return [FakeEnv(self.key, i, self.spec, attempt, self.log) for i in range(self.spec.group_size)]

    async def make_env(self, index: int) -> Env:
        self.retries += 1
        self.log.append(f"make_env {self.key} {index}")
        return FakeEnv(self.key, index, self.spec, self.attempts + self.retries, self.log)

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        if self.spec.fail_at.get(self.key) == "compute_group_rewards":
            raise self.spec.fail(f"fake group {self.key} failed in compute_group_rewards")
        return [(0.0, {"group_size": len(trajectory_group)}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return self.tags

    async def cleanup(self) -> None:
        self.log.append(f"cleanup {self.key}")


class FakeDataset(RLDataset):
    """``num_batches`` batches of ``batch_size`` fake groups; the last may be smaller.

    Args:
        batch_sizes: every batch's size, instead of ``num_batches``/``batch_size``/``last_batch_size``.

    Attributes:
        log: what the fake envs did (``make_envs``, ``cleanup``, ``hang``).
    """

    def __init__(
        self,
        num_batches: int = 0,
        batch_size: int = 0,
        spec: FakeEnvSpec | None = None,
        *,
        last_batch_size: int | None = None,
        batch_sizes: Sequence[int] | None = None,
        tags: Callable[[int, int], Sequence[str]] = lambda b, g: ("even" if g % 2 == 0 else "odd",),
    ) -> None:
        if batch_sizes is None:
            last = batch_size if last_batch_size is None else last_batch_size
            batch_sizes = [batch_size] * max(0, num_batches - 1) + [last] * min(1, num_batches)
        self.batch_sizes = list(batch_sizes)
        self.spec = spec or FakeEnvSpec()
        self.tags = tags
        self.log: list[str] = []
        self._builders: dict[tuple[int, int], FakeEnvGroupBuilder] = {}
        self.batches_built: list[int] = []
        """The index of every ``get_batch`` call, in order."""

    def __len__(self) -> int:
        return len(self.batch_sizes)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self.batch_sizes):
            raise IndexError(f"batch {index} out of range for {len(self.batch_sizes)} batches")
        self.batches_built.append(index)
        # The same builder object each time, so tests can inspect its attempts.
        return [
            self._builders.setdefault(
                (index, g), FakeEnvGroupBuilder((index, g), self.spec, self.log, self.tags(index, g))
            )
            for g in range(self.batch_sizes[index])
        ]

    @property
    def total_groups(self) -> int:
        """Groups in the whole dataset."""
        return sum(self.batch_sizes)


class FakeEvaluator:
    """Records which weights versions it evaluated; optionally slow or failing."""

    def __init__(self, latency: float = 0.0, fail_on_call: int | None = None) -> None:
        self.latency = latency
        self.fail_on_call = fail_on_call
        self.versions: list[int] = []

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        if self.fail_on_call is not None and len(self.versions) == self.fail_on_call:
            raise RuntimeError("fake evaluator failed")
        await trio.sleep(self.latency)
        version = getattr(sampling_client, "version", -1)
        self.versions.append(version)
        return {"test/version": float(version)}
