"""The fake backend's training and sampling clients, and its tokenizer."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

import trio
from tinker import types as tinker_types

from .. import _tinker_compat as compat
from ..base.determinism import derive_seed
from .calls import latency_of
from .inflight import InflightWeights
from .service import FakeService


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
    # Read from the text chunks: an image chunk (which the fake takes, as Tinker does) holds no ids.
    chunks = datum.model_input.chunks
    tokens = [t for c in chunks if isinstance(c, tinker_types.EncodedTextChunk) for t in c.tokens[:2]][:2]
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
        backend: FakeService,
        version: int,
        model_path: str | None,
        inflight: InflightWeights | None = None,
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
        backend.record("sample", self.version, seed=sampling_params.seed, prompt_len=compat.token_count(prompt))
        await trio.sleep(latency_of(backend.sample_latency, (prompt, num_samples, sampling_params)))
        if backend.fail_sample is not None:
            raise backend.fail_sample
        # A seeded request depends on its seed, not on its prompt; an unseeded one
        # on its prompt (tuples of ints hash the same in every process).
        base = sampling_params.seed if sampling_params.seed is not None else hash(tuple(prompt.to_ints()))
        max_tokens = sampling_params.max_tokens or 16
        rngs = [random.Random(derive_seed(backend.seed, base, i, self.version)) for i in range(num_samples)]
        if backend.sampler.response_length is None:
            lengths = [rng.randint(1, max_tokens) for rng in rngs]
        else:
            lengths = backend.response_lengths(prompt.to_ints(), num_samples, max_tokens)
        inflight = self._inflight
        if backend.sampler_model is not None:
            versions = await backend.sampler_model.serve(
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
            tokens = rng.choices(range(backend.sampler.vocab_size), k=n)
            logprobs = [-3 * rng.random() for _ in range(n)]
            stop: tinker_types.StopReason = "stop" if n < max_tokens else "length"
            sequences.append(compat.sampled_sequence(tokens, logprobs, stop, token_versions=token_versions))
        return compat.sample_response(sequences)

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        backend = self._backend
        backend.record("compute_logprobs", self.version, prompt_len=prompt.length)
        await trio.sleep(latency_of(backend.sample_latency, prompt))
        rng = random.Random(derive_seed(backend.seed, self.version, *prompt.to_ints()))
        # The first token has no logprob; an empty prompt has none at all.
        return [None, *(-rng.random() * 3 for _ in range(prompt.length - 1))][: prompt.length]


class FakeTrainingClient:
    """Processes requests in submission order, each after its virtual latency.

    The weights are just a version number: each ``optim_step`` adds one.
    """

    def __init__(self, backend: FakeService, version: int = 0) -> None:
        self._backend = backend
        self.version = version
        self._busy_until = -math.inf
        self._inflight = InflightWeights()

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
            backend.record(
                "forward_backward", self.version, data=len(data), tokens=tokens, loss_fn=loss_fn, groups=groups
            )
        await trio.lowlevel.checkpoint()
        outputs = [{"logprobs": compat.tensor([-0.5] * compat.token_count(d.model_input), "float32")} for d in data]
        value = compat.forward_backward_output(outputs, {"loss:sum": float(tokens) * 0.5})
        ready = self._schedule(latency_of(backend.train_latency, data))
        return _FakePending(ready, value, backend.fail_train)

    async def optim_step(self, adam_params: tinker_types.AdamParams) -> _FakePending:
        backend = self._backend
        backend.record("optim_step", self.version, learning_rate=adam_params.learning_rate)
        await trio.lowlevel.checkpoint()
        self.version += 1
        ready = self._schedule(latency_of(backend.latencies.optim, adam_params))
        return _FakePending(ready, tinker_types.OptimStepResponse(metrics={"lr": adam_params.learning_rate}), None)

    async def save_weights_for_sampler(self, name: str, *, inflight: bool = False) -> FakeSamplingClient:
        """Save the weights as ``name`` and return a sampling client for them, after ``latencies.save``.

        With ``inflight``, they also become this client's in-flight weights the
        moment the save returns (the call's time plus its latency, queued behind
        earlier requests): every in-flight sampling client of this training
        client produces its later tokens from them. A save cancelled before it
        returns publishes nothing.
        """
        backend = self._backend
        backend.record("save_weights_for_sampler", self.version, name=name, inflight=inflight)
        # The weights as of the request, as the service processes requests in order.
        version = self.version if inflight else None
        await trio.sleep_until(self._schedule(latency_of(backend.latencies.save, name)))
        path = f"fake://sampler/{name}"
        if version is None:
            backend.samplers[path] = self.version
            return FakeSamplingClient(backend, self.version, path)
        backend.samplers[path] = version
        self._inflight.publish(version)
        return FakeSamplingClient(backend, version, path, self._inflight)

    async def save_state(self, name: str) -> str:
        backend = self._backend
        backend.record("save_state", self.version, name=name)
        await trio.sleep_until(self._schedule(latency_of(backend.latencies.save_state, name)))
        path = f"fake://state/{name}"
        backend.states[path] = self.version
        return path

    async def load_state(self, path: str, *, with_optimizer: bool = True) -> None:
        backend = self._backend
        if path not in backend.states:
            raise FileNotFoundError(f"no fake state saved at {path!r}")
        backend.record("load_state", self.version, path=path, with_optimizer=with_optimizer)
        await trio.lowlevel.checkpoint()
        self.version = backend.states[path]

    async def get_tokenizer(self) -> FakeTokenizer:
        return FakeTokenizer()
