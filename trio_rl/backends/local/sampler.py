"""Batched, KV-cached sampling from one frozen set of weights.

A :class:`SamplingEngine` owns a float64 copy of the weights. Concurrent
``sample`` calls queue requests; one engine task (started in the backend's
nursery when work arrives, gone when there is none) admits them into a running
batch between decode steps ("continuous batching"). Each engine iteration is one
worker-thread call that

1. runs ONE forward pass for every row already decoding (its last sampled token),
2. prefills the prompts of newly admitted requests (one more forward pass),
3. picks the next token of every row, and drops finished rows from the cache.

Rows of different lengths share one key/value cache tensor: each row writes its
next key/value at its own length and attends to slots below it, so no
left-padding is needed and positions are per row.

Determinism: every sampled row has its own ``torch.Generator`` seeded from
(request seed, sample index), and the forward pass runs in float64. CPU matmuls
can round differently depending on the batch's shape, but in float64 that noise
(~1e-16 relative) is far below float32 resolution, which is all a response
carries, and essentially never moves a token across a sampling boundary; so a
seeded request gives the same tokens and logprobs however it was batched
(``tests/test_local_sampler.py`` checks this; ``bench/batch_noise.py`` measures
how many float32 logprobs differ between a row decoded alone and in a batch, and
the benchmarks page has its numbers).

Token choice, stops and the request queue are shared with the Hugging Face
engine: see :mod:`.batching`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from tinker import types as tinker_types
from torch import Tensor

from trio_rl.backends.local.batching import BatchingEngine, pick_tokens, row_seed
from trio_rl.backends.local.model import KVCache, TransformerLM, causal_mask
from trio_rl.backends.local.prefix_cache import KV, Prefill
from trio_rl.backends.local.requests import Limits
from trio_rl.backends.local.runtime import BackendRuntime
from trio_rl.backends.local.tokenizer import CharTokenizer

__all__ = ["LocalSamplingClient", "SamplingEngine", "frozen_copy", "pick_tokens", "row_seed"]

_CACHE_CHUNK = 32  # grow the cache by this many slots at a time


def frozen_copy(model: TransformerLM) -> TransformerLM:
    """A float64 copy of ``model`` without gradients: the weights a :class:`SamplingEngine` reads."""
    copy = TransformerLM(model.config, model.vocab_size).to(torch.float64)
    copy.load_state_dict(model.state_dict())
    return copy.requires_grad_(False).eval()


class SamplingEngine(BatchingEngine[TransformerLM]):
    """Serves ``sample`` and ``compute_logprobs`` for one frozen set of weights, or in-flight ones.

    Args:
        weights: the weights to sample from, a :func:`frozen_copy` that the engine owns.
        tokenizer: turns string stop sequences into tokens; its EOS is the default stop.
        runtime: the backend's nursery (for the engine task), thread limiter
            and seed source (for requests that bring no seed).
        inflight: an in-flight engine (see :class:`~.batching.BatchingEngine`).
        version: the version of ``weights`` (optimizer steps taken).
    """

    def __init__(
        self,
        weights: TransformerLM,
        tokenizer: CharTokenizer,
        runtime: BackendRuntime,
        *,
        inflight: bool = False,
        version: int = 0,
    ) -> None:
        super().__init__(
            runtime,
            limits=Limits(weights.vocab_size, weights.config.max_seq_len, frozenset({tokenizer.eos_token_id})),
            inflight=inflight,
            version=version,
        )
        self._model = weights
        self._tokenizer = tokenizer
        self._cache: KVCache = []
        self._lengths = torch.zeros(0, dtype=torch.long)
        self._last = torch.zeros(0, dtype=torch.long)

    def _use_weights(self, weights: TransformerLM) -> None:
        self._model = weights

    def _encode_stop_string(self, text: str) -> list[tuple[int, ...]] | None:
        # Characters are tokens, so a stop string is exactly one token sequence.
        return [tuple(self._tokenizer.encode(text))]

    def _score(self, tokens: list[int]) -> list[float]:
        x = torch.tensor([tokens])
        n = len(tokens)
        logits, _ = self._model(x, torch.arange(n)[None], causal_mask(torch.tensor([n]), n))
        logp = torch.log_softmax(logits[0, :-1], dim=-1).gather(1, x[0, 1:, None])[:, 0]
        return [float(v) for v in logp.tolist()]

    def _feed_tokens(self, tokens: Tensor) -> None:
        self._last = tokens

    def _clear_rows(self) -> None:
        self._cache = []
        self._lengths = torch.zeros(0, dtype=torch.long)
        self._last = torch.zeros(0, dtype=torch.long)

    def _keep_rows(self, keep: Tensor) -> None:
        self._cache = [(k.index_select(0, keep), v.index_select(0, keep)) for k, v in self._cache]
        self._lengths = self._lengths.index_select(0, keep)
        self._last = self._last.index_select(0, keep)

    def _decode(self) -> Tensor:
        rows = len(self._rows)
        need = int(self._lengths.max()) + 1
        slots = self._cache[0][0].shape[2]
        if need > slots:
            grow = _CACHE_CHUNK * math.ceil((need - slots) / _CACHE_CHUNK)
            self._cache = [(_pad_slots(k, slots + grow), _pad_slots(v, slots + grow)) for k, v in self._cache]
            slots += grow
        mask = (torch.arange(slots)[None, :] <= self._lengths[:, None])[:, None, None, :]
        logits, _ = self._model(
            self._last[:, None], self._lengths[:, None], mask, self._cache, write_slots=self._lengths
        )
        self._lengths = self._lengths + 1
        assert logits.shape[0] == rows
        out: Tensor = logits[:, 0]
        return out

    def _prefill_prompts(self, prompts: list[list[int]], pasts: list[KV] | None = None) -> list[Prefill]:
        # Each row's cached keys and values sit in slots [0, done); its new tokens,
        # right-padded, write theirs from slot `done` on, as decode steps do, so a
        # row's whole prompt ends up in slots [0, len(prompt)) of one tensor.
        kv_in = pasts if pasts is not None else [[] for _ in prompts]
        done = torch.tensor([kv[0][0].shape[2] if kv else 0 for kv in kv_in])
        todo = torch.tensor([len(p) for p in prompts]) - done
        width = int(todo.max())
        tokens = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, (prompt, start) in enumerate(zip(prompts, done.tolist(), strict=True)):
            tokens[i, : len(prompt) - start] = torch.tensor(prompt[start:])
        write = done[:, None] + torch.arange(width)  # padding writes past a row's end: slots no real query reads
        slots = int(done.max()) + width
        mask = (torch.arange(slots)[None, None, :] <= write[:, :, None])[:, None]
        cache = [_slots_with(kv_in, layer, slots, self._model) for layer in range(self._model.config.n_layers)]
        positions = write.clamp(max=self._model.config.max_seq_len - 1)
        hidden, kv = self._model.hidden(tokens, positions, mask, cache, write_slots=write)
        last = self._model.head(hidden[torch.arange(len(prompts)), todo - 1])
        return [
            Prefill([(k[i : i + 1, :, :n], v[i : i + 1, :, :n]) for k, v in kv], last[i])
            for i, n in enumerate(len(p) for p in prompts)
        ]

    def _append_rows(self, prefills: list[Prefill], repeats: list[int]) -> None:
        width = max(p.length for p in prefills)
        index = torch.arange(len(prefills)).repeat_interleave(torch.tensor(repeats))
        layers = range(len(prefills[0].kv))
        new_cache = [
            (
                torch.cat([_pad_slots(p.kv[layer][0], width) for p in prefills])[index],
                torch.cat([_pad_slots(p.kv[layer][1], width) for p in prefills])[index],
            )
            for layer in layers
        ]
        new_lengths = torch.tensor([p.length for p in prefills])[index]
        if self._cache:
            slots = max(self._cache[0][0].shape[2], width)
            self._cache = [
                (
                    torch.cat([_pad_slots(k0, slots), _pad_slots(k1, slots)]),
                    torch.cat([_pad_slots(v0, slots), _pad_slots(v1, slots)]),
                )
                for (k0, v0), (k1, v1) in zip(self._cache, new_cache, strict=True)
            ]
        else:
            self._cache = new_cache
        self._lengths = torch.cat([self._lengths, new_lengths])
        self._last = torch.cat([self._last, torch.zeros(len(new_lengths), dtype=torch.long)])


def _slots_with(pasts: list[KV], layer: int, slots: int, model: TransformerLM) -> tuple[Tensor, Tensor]:
    """A ``[rows, heads, slots, head_dim]`` key and value cache of one layer holding each row's past tokens first."""
    config = model.config
    shape = (len(pasts), config.n_heads, slots, config.d_model // config.n_heads)
    dtype = model.head.weight.dtype
    keys, values = torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)
    for i, kv in enumerate(pasts):
        if kv:
            n = kv[layer][0].shape[2]
            keys[i, :, :n] = kv[layer][0][0]
            values[i, :, :n] = kv[layer][1][0]
    return keys, values


def _pad_slots(t: Tensor, slots: int) -> Tensor:
    """Pad a ``[rows, heads, slots, dim]`` cache tensor with zeros to ``slots`` slots."""
    have = t.shape[2]
    if have == slots:
        return t
    pad = t.new_zeros(t.shape[0], t.shape[1], slots - have, t.shape[3])
    return torch.cat([t, pad], dim=2)


class LocalSamplingClient:
    """A sampling client pinned to one snapshot of a training client's weights, or following its in-flight ones.

    Created by ``LocalTrainingClient.save_weights_for_sampler``. A snapshot
    client (the default): later optimizer steps never change what it samples.
    An in-flight client (``inflight=True``) shares its training client's
    in-flight engine: each request starts on the newest weights published in
    flight, running requests switch to weights published later between two
    tokens, and every ``SampledSequence`` is a ``VersionedSequence`` saying
    which weights version produced each token.
    """

    def __init__(self, engine: BatchingEngine[Any], model_path: str | None) -> None:
        self._engine = engine
        self._model_path = model_path

    @property
    def model_path(self) -> str | None:
        """The folder the weights were saved to."""
        return self._model_path

    async def sample(
        self,
        prompt: tinker_types.ModelInput,
        num_samples: int,
        sampling_params: tinker_types.SamplingParams,
    ) -> tinker_types.SampleResponse:
        """Sample ``num_samples`` continuations of ``prompt``, batched with concurrent calls.

        ``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed`` and
        ``stop`` behave as in ``tinker.types.SamplingParams``: ``stop=None``
        stops at the tokenizer's EOS, ``[]`` disables stopping, strings are
        tokenized, ints are single-token stops; the stop tokens are included
        in the returned tokens. Generation also ends (``"length"``) when the
        sequence reaches the model's ``max_seq_len``. Logprobs are those of the
        sampled tokens under ``log_softmax(logits / temperature)`` (temperature
        1 for greedy sampling), rounded to float32. A request with a ``seed``
        gets the same tokens however it is batched; one without draws a seed
        from the backend's seeded RNG in arrival order, which Trio's scheduling
        may shuffle, so pass seeds where runs must repeat.

        Args:
            prompt: the tokens to continue (at least one).
            num_samples: how many independent continuations.
            sampling_params: see above.

        Returns:
            One ``SampledSequence`` per sample, in order.

        Raises:
            RuntimeError: if the backend is not entered (use ``async with backend:``).
            ValueError: for an empty or too-long prompt, unknown token ids or bad params.
        """
        return await self._engine.sample(prompt, num_samples, sampling_params)

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        """Score ``prompt``: ``None`` for its first token, then each token's logprob.

        Raises:
            RuntimeError: if the backend is not entered.
            ValueError: for a too-long prompt or unknown token ids.
        """
        return await self._engine.compute_logprobs(prompt)
