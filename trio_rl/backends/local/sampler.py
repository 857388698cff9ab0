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
it: over 200 random trials, 17% of float32 next-token logprobs differed in some
bit between a row decoded alone and in a batch of 8 of other lengths; computed
in float64 and rounded to float32, none of the 144,000 did).

Logprobs: the returned logprob of a sampled token is taken under the
temperature-scaled distribution ``log_softmax(logits / temperature)``, before
top-k/top-p truncation, i.e. what the Tinker service reportedly returns (a
tinker-cookbook maintainer confirmed in its PR #86 that the service returns "the
same logprobs used for sampling, even when temperature scaling is applied"). At
temperature 1 these are exactly the policy's logprobs, which is what the RL
losses' importance ratios assume; greedy requests (temperature 0 or top_k 1)
report temperature-1 logprobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import trio
import trio.lowlevel
from tinker import types as tinker_types
from torch import Tensor

from trio_rl import _tinker_compat
from trio_rl.backends.local.model import KVCache, TransformerLM, causal_mask
from trio_rl.backends.local.runtime import BackendRuntime
from trio_rl.backends.local.tokenizer import CharTokenizer

_CACHE_CHUNK = 32  # grow the cache by this many slots at a time


def row_seed(seed: int, index: int) -> int:
    """A 63-bit seed for sample ``index`` of a request seeded with ``seed`` (SplitMix64 mix)."""
    mask = (1 << 64) - 1
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def pick_tokens(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, uniform: Tensor
) -> tuple[Tensor, Tensor]:
    """Choose one token per row; every operation is row-wise, so rows never interact.

    Args:
        logits: ``[rows, vocab]`` float64 logits.
        temperature: ``[rows]``; ``<= 0`` means greedy.
        top_k: ``[rows]``; ``<= 0`` means no limit, ``1`` means greedy.
        top_p: ``[rows]`` nucleus mass in ``(0, 1]``.
        uniform: ``[rows]`` draws in ``[0, 1)`` from each row's own generator.

    Returns:
        The chosen tokens ``[rows]`` and their logprobs ``[rows]`` under the
        temperature-scaled distribution ``log_softmax(logits / temperature)``
        (before top-k/top-p truncation; at temperature 1 the model's own
        logprobs; for greedy rows, at temperature 1).
    """
    vocab = logits.shape[-1]
    greedy = (temperature <= 0) | (top_k == 1)
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)
    probs = logp.exp()
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab)
    keep = (top_k[:, None] <= 0) | (rank[None, :] < top_k[:, None])
    # Nucleus: keep a token while the mass ranked above it is still below top_p.
    keep &= (torch.cumsum(sorted_p, dim=-1) - sorted_p) < top_p[:, None]
    keep[:, 0] = True
    cdf = torch.cumsum(sorted_p * keep, dim=-1)
    target = (uniform * cdf[:, -1])[:, None]
    idx = torch.searchsorted(cdf, target, right=True).clamp_(max=vocab - 1)
    tokens = torch.where(greedy, order[:, 0], order.gather(1, idx)[:, 0])
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    num_samples: int
    max_new: int
    temperature: float
    top_k: int
    top_p: float
    stop_ids: frozenset[int]
    stop_seqs: list[tuple[int, ...]]
    seed: int
    done: trio.Event = field(default_factory=trio.Event)
    results: list[tinker_types.SampledSequence | None] = field(default_factory=list)
    remaining: int = 0
    error: BaseException | None = None
    cancelled: bool = False


@dataclass(eq=False)
class _Row:
    request: _Request
    index: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def _to_f32(x: float) -> float:
    return float(np.float32(x))


class SamplingEngine:
    """Serves ``sample`` and ``compute_logprobs`` for one frozen set of weights.

    Args:
        model: the weights to sample from; the engine keeps its own float64 copy.
        tokenizer: turns string stop sequences into tokens; its EOS is the default stop.
        runtime: the backend's nursery (for the engine task), thread limiter
            and seed source (for requests that bring no seed).
    """

    def __init__(self, model: TransformerLM, tokenizer: CharTokenizer, runtime: BackendRuntime) -> None:
        self._model = TransformerLM(model.config, model.vocab_size).to(torch.float64)
        self._model.load_state_dict(model.state_dict())
        self._model.requires_grad_(False).eval()
        self._tokenizer = tokenizer
        self._runtime = runtime
        self._limiter = runtime.limiter
        self._max_rows = runtime.max_batch_rows
        self._pending: list[_Request] = []
        self._running = False
        # Decoding state; touched only by the engine task and its worker thread.
        self._rows: list[_Row] = []
        self._cache: KVCache = []
        self._lengths = torch.zeros(0, dtype=torch.long)
        self._last = torch.zeros(0, dtype=torch.long)

    # ----------------------------------------------------------------- requests

    def _make_request(
        self, prompt: list[int], num_samples: int, params: tinker_types.SamplingParams
    ) -> _Request:
        cfg = self._model.config
        vocab = self._model.vocab_size
        if num_samples < 1:
            raise ValueError("num_samples must be at least 1")
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        if len(prompt) >= cfg.max_seq_len:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room (max_seq_len {cfg.max_seq_len})")
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt has token ids outside [0, {vocab})")
        room = cfg.max_seq_len - len(prompt)
        if params.max_tokens is not None and params.max_tokens < 0:
            raise ValueError("max_tokens must not be negative")
        max_new = room if params.max_tokens is None else min(params.max_tokens, room)
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        stop_ids: set[int] = set()
        stop_seqs: list[tuple[int, ...]] = []
        stop = params.stop
        if stop is None:
            stop_ids.add(self._tokenizer.eos_token_id)
        else:
            items: list[str | int] = [stop] if isinstance(stop, str) else list(stop)
            for item in items:
                seq = tuple(self._tokenizer.encode(item)) if isinstance(item, str) else (int(item),)
                if len(seq) == 1:
                    stop_ids.add(seq[0])
                elif seq:
                    stop_seqs.append(seq)
        seed = params.seed if params.seed is not None else self._runtime.rng.getrandbits(63)
        return _Request(
            prompt=prompt,
            num_samples=num_samples,
            max_new=max_new,
            temperature=float(params.temperature),
            top_k=int(params.top_k),
            top_p=float(params.top_p),
            stop_ids=frozenset(stop_ids),
            stop_seqs=stop_seqs,
            seed=int(seed),
            results=[None] * num_samples,
            remaining=num_samples,
        )

    async def sample(
        self,
        prompt: tinker_types.ModelInput,
        num_samples: int,
        sampling_params: tinker_types.SamplingParams,
    ) -> tinker_types.SampleResponse:
        """Queue a request, wait for all of its samples, and return them.

        Cancelling the wait withdraws the request: it is dropped from the queue,
        or from the running batch at the next decode step.

        Raises:
            ValueError: for an empty or too-long prompt, bad token ids or bad params.
            RuntimeError: if the backend is not entered, or closed while waiting.
        """
        self._runtime.require_entered()
        request = self._make_request(prompt.to_ints(), num_samples, sampling_params)
        if request.max_new == 0:
            empty = _tinker_compat.sampled_sequence([], [], "length")
            return _tinker_compat.sample_response([empty] * num_samples)
        if not self._running:
            self._runtime.spawn(self._run)  # raises if the backend isn't entered
            self._running = True
        self._pending.append(request)
        try:
            await request.done.wait()
        except BaseException:
            request.cancelled = True
            if request in self._pending:
                self._pending.remove(request)
            raise
        if request.error is not None:
            raise request.error
        return _tinker_compat.sample_response([s for s in request.results if s is not None])

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        """Score ``prompt``: ``[None, logprob(t1 | t0), logprob(t2 | t0 t1), ...]``.

        Raises:
            ValueError: for an empty or too-long prompt or bad token ids.
        """
        self._runtime.require_entered()
        tokens = prompt.to_ints()
        if not tokens:
            return []
        if len(tokens) > self._model.config.max_seq_len:
            raise ValueError(f"prompt longer than max_seq_len {self._model.config.max_seq_len}")
        if any(not 0 <= t < self._model.vocab_size for t in tokens):
            raise ValueError("prompt has token ids outside the vocabulary")

        def score() -> list[float | None]:
            with torch.inference_mode():
                x = torch.tensor([tokens])
                n = len(tokens)
                logits, _ = self._model(x, torch.arange(n)[None], causal_mask(torch.tensor([n]), n))
                logp = torch.log_softmax(logits[0, :-1], dim=-1).gather(1, x[0, 1:, None])[:, 0]
            return [None, *(_to_f32(v) for v in logp.tolist())]

        return await trio.to_thread.run_sync(score, limiter=self._limiter)

    # ------------------------------------------------------------------- engine

    async def _run(self) -> None:
        try:
            # One extra tick lets every task that is submitting right now queue
            # its request, so a burst starts as one batch.
            await trio.lowlevel.checkpoint()
            while True:
                self._pending = [r for r in self._pending if not r.cancelled]
                if not self._rows and not self._pending:
                    break  # no checkpoint since the check: sample() sees _running drop
                admit: list[_Request] = []
                rows = len(self._rows)
                while self._pending and (rows == 0 or rows + self._pending[0].num_samples <= self._max_rows):
                    request = self._pending.pop(0)
                    admit.append(request)
                    rows += request.num_samples
                try:
                    finished = await trio.to_thread.run_sync(self._step, admit, limiter=self._limiter)
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    # A failed step fails the requests in it, not the backend.
                    for request in {row.request for row in self._rows} | set(admit):
                        request.error = exc
                        request.done.set()
                    self._reset()
                    continue
                for row, reason in finished:
                    self._deliver(row, reason)
        finally:
            self._running = False
            closed = RuntimeError("the LocalBackend was closed while this request was waiting")
            for request in [*self._pending, *(row.request for row in self._rows)]:
                if not request.done.is_set():
                    request.error = closed
                    request.done.set()
            self._pending.clear()
            self._reset()

    def _reset(self) -> None:
        self._rows = []
        self._cache = []
        self._lengths = torch.zeros(0, dtype=torch.long)
        self._last = torch.zeros(0, dtype=torch.long)

    @staticmethod
    def _deliver(row: _Row, reason: tinker_types.StopReason) -> None:
        request = row.request
        if request.cancelled or request.done.is_set():
            return
        request.results[row.index] = _tinker_compat.sampled_sequence(row.tokens, row.logprobs, reason)
        request.remaining -= 1
        if request.remaining == 0:
            request.done.set()

    def _step(self, admit: list[_Request]) -> list[tuple[_Row, tinker_types.StopReason]]:
        """One engine iteration, in a worker thread (see the module docstring)."""
        with torch.inference_mode():
            self._drop([i for i, row in enumerate(self._rows) if row.request.cancelled])
            logits: list[Tensor] = []
            if self._rows:
                logits.append(self._decode())
            if admit:
                logits.append(self._prefill(admit))
            if not logits:
                return []
            return self._choose(torch.cat(logits))

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

    def _prefill(self, admit: list[_Request]) -> Tensor:
        lengths = torch.tensor([len(r.prompt) for r in admit])
        width = int(lengths.max())
        tokens = torch.zeros(len(admit), width, dtype=torch.long)
        for i, request in enumerate(admit):
            tokens[i, : len(request.prompt)] = torch.tensor(request.prompt)
        positions = torch.arange(width).expand(len(admit), width)
        logits: Tensor
        logits, kv = self._model(tokens, positions, causal_mask(lengths, width))
        # Every sample of a request starts from the same prompt: prefill once, copy rows.
        repeats = torch.tensor([r.num_samples for r in admit])
        last = logits[torch.arange(len(admit)), lengths - 1].repeat_interleave(repeats, dim=0)
        new_cache = [(k.repeat_interleave(repeats, 0), v.repeat_interleave(repeats, 0)) for k, v in kv]
        new_lengths = lengths.repeat_interleave(repeats)
        for request in admit:
            for index in range(request.num_samples):
                gen = torch.Generator().manual_seed(row_seed(request.seed, index))
                self._rows.append(_Row(request=request, index=index, generator=gen))
        if self._cache:
            slots = max(self._cache[0][0].shape[2], width)
            self._cache = [
                (torch.cat([_pad_slots(k0, slots), _pad_slots(k1, slots)]),
                 torch.cat([_pad_slots(v0, slots), _pad_slots(v1, slots)]))
                for (k0, v0), (k1, v1) in zip(self._cache, new_cache, strict=True)
            ]
        else:
            self._cache = new_cache
        self._lengths = torch.cat([self._lengths, new_lengths])
        self._last = torch.cat([self._last, torch.zeros(len(new_lengths), dtype=torch.long)])
        return last

    def _choose(self, logits: Tensor) -> list[tuple[_Row, tinker_types.StopReason]]:
        rows = self._rows
        temperature = torch.tensor([r.request.temperature for r in rows], dtype=torch.float64)
        top_k = torch.tensor([r.request.top_k for r in rows])
        top_p = torch.tensor([r.request.top_p for r in rows], dtype=torch.float64)
        uniform = torch.stack([torch.rand((), generator=r.generator, dtype=torch.float64) for r in rows])
        tokens, logprobs = pick_tokens(logits, temperature, top_k, top_p, uniform)
        finished: list[tuple[_Row, tinker_types.StopReason]] = []
        done: list[int] = []
        for i, (row, tok, lp) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            row.tokens.append(tok)
            row.logprobs.append(_to_f32(lp))
            request = row.request
            if tok in request.stop_ids or any(
                tuple(row.tokens[-len(s):]) == s for s in request.stop_seqs
            ):
                finished.append((row, "stop"))
                done.append(i)
            elif len(row.tokens) >= request.max_new:
                finished.append((row, "length"))
                done.append(i)
        self._last = tokens
        self._drop(done)
        return finished

    def _drop(self, indices: Sequence[int]) -> None:
        if not indices:
            return
        gone = set(indices)
        keep = torch.tensor([i for i in range(len(self._rows)) if i not in gone], dtype=torch.long)
        self._rows = [row for i, row in enumerate(self._rows) if i not in gone]
        if not self._rows:
            self._reset()
            return
        self._cache = [(k.index_select(0, keep), v.index_select(0, keep)) for k, v in self._cache]
        self._lengths = self._lengths.index_select(0, keep)
        self._last = self._last.index_select(0, keep)


def _pad_slots(t: Tensor, slots: int) -> Tensor:
    """Pad a ``[rows, heads, slots, dim]`` cache tensor with zeros to ``slots`` slots."""
    have = t.shape[2]
    if have == slots:
        return t
    pad = t.new_zeros(t.shape[0], t.shape[1], slots - have, t.shape[3])
    return torch.cat([t, pad], dim=2)


class LocalSamplingClient:
    """A sampling client pinned to one snapshot of a training client's weights.

    Created by ``LocalTrainingClient.save_weights_for_sampler``; later optimizer
    steps never change what it samples.
    """

    def __init__(self, engine: SamplingEngine, model_path: str | None) -> None:
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
