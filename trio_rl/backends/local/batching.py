"""Continuous batching of ``sample`` requests, independent of the model behind it.

:class:`BatchingEngine` holds what every in-process sampler shares: request
validation, the queue, the one engine task that admits queued requests into a
running batch between decode steps, token choice (:func:`pick_tokens`, one
generator per sampled row), stop conditions and delivery. A subclass supplies
the model side, run in a worker thread:

* :meth:`BatchingEngine._decode` and :meth:`BatchingEngine._prefill`: one
  decode pass for the rows already running and one prefill pass for the newly
  admitted requests, each returning next-token logits;
* :meth:`BatchingEngine._keep_rows` / :meth:`BatchingEngine._clear_rows`: drop
  finished rows from the model's cache;
* :meth:`BatchingEngine._score`: ``compute_logprobs``.

The toy model's engine (:mod:`.sampler`) and the Hugging Face engine
(:mod:`trio_rl.backends.hf.sampler`) are the two subclasses; an engine of
another kind (vLLM) would implement the same client protocol on its own.

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

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import trio
import trio.lowlevel
from tinker import types as tinker_types
from torch import Tensor

from trio_rl import _tinker_compat
from trio_rl.backends.local.runtime import BackendRuntime


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
class Request:
    """One ``sample`` call: its prompt, parameters, and the samples delivered so far."""

    prompt: list[int]
    num_samples: int
    max_new: int
    temperature: float
    top_k: int
    top_p: float
    stop_ids: frozenset[int]
    stop_seqs: list[tuple[int, ...]]
    stop_strings: list[str]
    seed: int
    done: trio.Event = field(default_factory=trio.Event)
    results: list[tinker_types.SampledSequence | None] = field(default_factory=list)
    remaining: int = 0
    error: BaseException | None = None
    cancelled: bool = False


@dataclass(eq=False)
class Row:
    """One sample of a request being decoded, with its own random generator."""

    request: Request
    index: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def _to_f32(x: float) -> float:
    return float(np.float32(x))


class BatchingEngine:
    """Serves ``sample`` and ``compute_logprobs`` for one frozen set of weights.

    Args:
        runtime: the backend's nursery (for the engine task), thread limiter
            and seed source (for requests that bring no seed).
        vocab_size: token ids must lie in ``[0, vocab_size)``.
        max_seq_len: prompt plus sampled tokens never exceed this.
        default_stop_ids: the stop tokens of a request whose ``stop`` is ``None``.
    """

    def __init__(
        self, runtime: BackendRuntime, *, vocab_size: int, max_seq_len: int, default_stop_ids: frozenset[int]
    ) -> None:
        self._runtime = runtime
        self._limiter = runtime.limiter
        self._max_rows = runtime.max_batch_rows
        self._vocab_size = vocab_size
        self._max_seq_len = max_seq_len
        self._default_stop_ids = default_stop_ids
        self._pending: list[Request] = []
        self._running = False
        # Decoding state; touched only by the engine task and its worker thread.
        self._rows: list[Row] = []

    # ------------------------------------------------------------ model hooks

    def _forward_step(self, admit: list[Request]) -> Tensor | None:
        """Logits ``[rows, vocab]`` (float64, CPU) for running rows, then admitted rows.

        Called in a worker thread under ``torch.inference_mode``: one
        :meth:`_decode` pass for the running rows, one :meth:`_prefill` pass
        for the admitted requests. Returns ``None`` when there are no rows at all.
        """
        self._select_weights()
        logits: list[Tensor] = []
        if self._rows:
            logits.append(self._decode())
        if admit:
            logits.append(self._prefill(admit))
        return torch.cat(logits) if logits else None

    def _select_weights(self) -> None:
        """Make this engine's weights the ones the next forward pass uses (if shared)."""

    def _decode(self) -> Tensor:
        """One forward pass of every running row's last token; their next-token logits."""
        raise NotImplementedError

    def _prefill(self, admit: list[Request]) -> Tensor:
        """Prefill the admitted prompts, append their rows (via :meth:`_new_rows`)
        and cache; the logits of each new row's first token."""
        raise NotImplementedError

    def _feed_tokens(self, tokens: Tensor) -> None:
        """Remember each row's chosen token: the next decode pass's input."""
        raise NotImplementedError

    def _keep_rows(self, keep: Tensor) -> None:
        """Keep only the cache rows at indices ``keep`` (in order)."""
        raise NotImplementedError

    def _clear_rows(self) -> None:
        """Drop the whole cache."""
        raise NotImplementedError

    def _score(self, tokens: list[int]) -> list[float]:
        """Logprob of each token after the first, given those before it (worker thread)."""
        raise NotImplementedError

    def _stop_string_hit(self, row: Row) -> bool:
        """Whether the row's text now contains one of its request's stop strings."""
        return False

    def _encode_stop_string(self, text: str) -> list[tuple[int, ...]] | None:
        """Token sequences to stop at for ``text``, or ``None`` to match it as text."""
        raise NotImplementedError

    # ----------------------------------------------------------------- requests

    def _make_request(self, prompt: list[int], num_samples: int, params: tinker_types.SamplingParams) -> Request:
        vocab = self._vocab_size
        if num_samples < 1:
            raise ValueError("num_samples must be at least 1")
        if not prompt:
            raise ValueError("the prompt must hold at least one token")
        if len(prompt) >= self._max_seq_len:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room (max_seq_len {self._max_seq_len})")
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt has token ids outside [0, {vocab})")
        room = self._max_seq_len - len(prompt)
        if params.max_tokens is not None and params.max_tokens < 0:
            raise ValueError("max_tokens must not be negative")
        max_new = room if params.max_tokens is None else min(params.max_tokens, room)
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        stop_ids: set[int] = set()
        stop_seqs: list[tuple[int, ...]] = []
        stop_strings: list[str] = []
        stop = params.stop
        if stop is None:
            stop_ids.update(self._default_stop_ids)
        else:
            items: list[str | int] = [stop] if isinstance(stop, str) else list(stop)
            for item in items:
                if isinstance(item, str):
                    seqs = self._encode_stop_string(item)
                    if seqs is None:
                        if item:
                            stop_strings.append(item)
                        continue
                else:
                    seqs = [(int(item),)]
                for seq in seqs:
                    if len(seq) == 1:
                        stop_ids.add(seq[0])
                    elif seq:
                        stop_seqs.append(seq)
        seed = params.seed if params.seed is not None else self._runtime.rng.getrandbits(63)
        return Request(
            prompt=prompt,
            num_samples=num_samples,
            max_new=max_new,
            temperature=float(params.temperature),
            top_k=int(params.top_k),
            top_p=float(params.top_p),
            stop_ids=frozenset(stop_ids),
            stop_seqs=stop_seqs,
            stop_strings=stop_strings,
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
        if len(tokens) > self._max_seq_len:
            raise ValueError(f"prompt longer than max_seq_len {self._max_seq_len}")
        if any(not 0 <= t < self._vocab_size for t in tokens):
            raise ValueError("prompt has token ids outside the vocabulary")

        def score() -> list[float | None]:
            with torch.inference_mode():
                return [None, *(_to_f32(v) for v in self._score(tokens))]

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
                admit: list[Request] = []
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
            closed = RuntimeError("the backend was closed while this request was waiting")
            for request in [*self._pending, *(row.request for row in self._rows)]:
                if not request.done.is_set():
                    request.error = closed
                    request.done.set()
            self._pending.clear()
            self._reset()

    def _reset(self) -> None:
        self._rows = []
        self._clear_rows()

    @staticmethod
    def _deliver(row: Row, reason: tinker_types.StopReason) -> None:
        request = row.request
        if request.cancelled or request.done.is_set():
            return
        request.results[row.index] = _tinker_compat.sampled_sequence(row.tokens, row.logprobs, reason)
        request.remaining -= 1
        if request.remaining == 0:
            request.done.set()

    def _new_rows(self, request: Request) -> None:
        """Append the rows of a newly admitted request, each with its own generator."""
        for index in range(request.num_samples):
            gen = torch.Generator().manual_seed(row_seed(request.seed, index))
            self._rows.append(Row(request=request, index=index, generator=gen))

    def _step(self, admit: list[Request]) -> list[tuple[Row, tinker_types.StopReason]]:
        """One engine iteration, in a worker thread."""
        with torch.inference_mode():
            self._drop([i for i, row in enumerate(self._rows) if row.request.cancelled])
            logits = self._forward_step(admit)
            if logits is None:
                return []
            return self._choose(logits)

    def _choose(self, logits: Tensor) -> list[tuple[Row, tinker_types.StopReason]]:
        rows = self._rows
        temperature = torch.tensor([r.request.temperature for r in rows], dtype=torch.float64)
        top_k = torch.tensor([r.request.top_k for r in rows])
        top_p = torch.tensor([r.request.top_p for r in rows], dtype=torch.float64)
        uniform = torch.stack([torch.rand((), generator=r.generator, dtype=torch.float64) for r in rows])
        tokens, logprobs = self._pick(logits, temperature, top_k, top_p, uniform)
        finished: list[tuple[Row, tinker_types.StopReason]] = []
        done: list[int] = []
        for i, (row, tok, lp) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            row.tokens.append(tok)
            row.logprobs.append(_to_f32(lp))
            request = row.request
            if (
                tok in request.stop_ids
                or any(tuple(row.tokens[-len(s) :]) == s for s in request.stop_seqs)
                or (request.stop_strings and self._stop_string_hit(row))
            ):
                finished.append((row, "stop"))
                done.append(i)
            elif len(row.tokens) >= request.max_new:
                finished.append((row, "length"))
                done.append(i)
        self._feed_tokens(tokens)
        self._drop(done)
        return finished

    def _pick(
        self, logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, uniform: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Choose each row's token: :func:`pick_tokens`, unless a subclass has a faster equivalent."""
        return pick_tokens(logits, temperature, top_k, top_p, uniform)

    def _drop(self, indices: Sequence[int]) -> None:
        if not indices:
            return
        gone = set(indices)
        keep = torch.tensor([i for i in range(len(self._rows)) if i not in gone], dtype=torch.long)
        self._rows = [row for i, row in enumerate(self._rows) if i not in gone]
        if not self._rows:
            self._reset()
            return
        self._keep_rows(keep)
