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

How a sampled token's logprob is taken is said in :mod:`.decode_batch`.
"""

from __future__ import annotations

import inspect
from typing import TypeVar

import torch
import trio
import trio.lowlevel
from tinker import types as tinker_types

from trio_rl import _tinker_compat
from trio_rl.backends.local.decode_batch import _deliver, _to_f32, pick_tokens
from trio_rl.backends.local.inflight import InflightBatch
from trio_rl.backends.local.requests import Limits, Request, Row, build_request, row_seed
from trio_rl.backends.local.runtime import BackendRuntime

__all__ = ["BatchingEngine", "Request", "Row", "pick_tokens", "row_seed"]

W = TypeVar("W")

_REPORTS_CACHE_HITS = "prompt_cache_hit_tokens" in inspect.signature(tinker_types.SampleResponse).parameters
"""Whether this tinker SDK's ``SampleResponse`` has the field the cookbook reads as ``prefill_cached``."""


def _fail(requests: set[Request], error: BaseException) -> None:
    for request in requests:
        if not request.done.is_set():
            request.error = error
            request.done.set()


class BatchingEngine(InflightBatch[W]):
    """Serves ``sample`` and ``compute_logprobs`` for one set of weights, or a training client's in-flight weights.

    An in-flight engine (shared by a training client's in-flight sampling
    clients) swaps in the weights given to :meth:`~.inflight.InflightBatch.publish`
    between decode steps and reports the version that produced each token.

    Args:
        runtime: the backend's nursery (for the engine task), thread limiter,
            seed source (for requests that bring no seed), and
            ``inflight_recompute_kv``.
        limits: what a request must fit: token ids in ``[0, vocab_size)``, prompt plus
            sampled tokens at most ``max_seq_len``, and the stop tokens of a request
            whose ``stop`` is ``None``.
        inflight: whether this is an in-flight engine.
        version: the version of its first weights (optimizer steps taken).
    """

    def __init__(
        self,
        runtime: BackendRuntime,
        *,
        limits: Limits,
        inflight: bool = False,
        version: int = 0,
    ) -> None:
        recompute = inflight and runtime.inflight_recompute_kv
        super().__init__(runtime.prefix_cache_bytes, inflight=inflight, version=version, recompute_kv=recompute)
        self._runtime = runtime
        self._limits = limits
        self._pending: list[Request] = []
        self._running = False

    # ------------------------------------------------------------------ requests

    async def sample(
        self, prompt: tinker_types.ModelInput, num_samples: int, sampling_params: tinker_types.SamplingParams
    ) -> tinker_types.SampleResponse:
        """Queue a request, wait for all of its samples, and return them.

        Cancelling the wait withdraws the request: it is dropped from the queue,
        or from the running batch at the next decode step.

        Raises:
            ValueError: for an empty or too-long prompt, bad token ids or bad params.
            RuntimeError: if the backend is not entered, or closed while waiting.
        """
        self._runtime.require_entered()
        request = build_request(
            _tinker_compat.token_ids(prompt, "the sample prompt"),
            num_samples,
            sampling_params,
            self._limits,
            self._encode_stop_string,
            self._runtime.rng,
        )
        if request.max_new == 0:
            return _tinker_compat.sample_response([_tinker_compat.sampled_sequence([], [], "length")] * num_samples)
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
        sequences = [s for s in request.results if s is not None]
        if _REPORTS_CACHE_HITS:
            return tinker_types.SampleResponse(sequences=sequences, prompt_cache_hit_tokens=request.cached_tokens)
        return _tinker_compat.sample_response(sequences)

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        """Score ``prompt``: ``[None, logprob(t1 | t0), logprob(t2 | t0 t1), ...]``.

        Raises:
            ValueError: for an empty or too-long prompt or bad token ids.
        """
        self._runtime.require_entered()
        tokens, limits = _tinker_compat.token_ids(prompt, "the compute_logprobs prompt"), self._limits
        if len(tokens) > limits.max_seq_len:
            raise ValueError(f"prompt longer than max_seq_len {limits.max_seq_len}")
        if any(not 0 <= t < limits.vocab_size for t in tokens):
            raise ValueError("prompt has token ids outside the vocabulary")

        def score() -> list[float | None]:
            with torch.inference_mode():
                return [None, *(_to_f32(v) for v in self._score(tokens))]

        return await trio.to_thread.run_sync(score, limiter=self._runtime.limiter) if tokens else []

    # -------------------------------------------------------------------- engine

    async def _run(self) -> None:
        try:
            # One extra tick lets every task that is submitting right now queue
            # its request, so a burst starts as one batch.
            await trio.lowlevel.checkpoint()
            while True:
                self._pending = [r for r in self._pending if not r.cancelled]
                if not self._rows and not self._pending:
                    break  # no checkpoint since the check: sample() sees _running drop
                admit = self._admit()
                try:
                    finished = await trio.to_thread.run_sync(self._step, admit, limiter=self._runtime.limiter)
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    # A failed step fails the requests in it, not the backend.
                    _fail({row.request for row in self._rows} | set(admit), exc)
                    self._reset()
                    continue
                for row, reason in finished:
                    _deliver(row, reason, self._inflight)
        finally:
            self._running = False
            closed = RuntimeError("the backend was closed while this request was waiting")
            _fail({*self._pending, *(row.request for row in self._rows)}, closed)
            self._pending.clear()
            self._reset()

    def _admit(self) -> list[Request]:
        """Take queued requests while their rows fit beside the running ones (at least one request)."""
        admit: list[Request] = []
        rows = len(self._rows)
        while self._pending and (rows == 0 or rows + self._pending[0].num_samples <= self._runtime.max_batch_rows):
            admit.append(self._pending.pop(0))
            rows += admit[-1].num_samples
        return admit
