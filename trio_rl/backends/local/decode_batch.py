"""The decoding batch of an in-process sampler: its rows, token choice, stop conditions and delivery.

:class:`DecodeBatch` is the part of :class:`~trio_rl.backends.local.batching.BatchingEngine`
that runs the rows already admitted: one prefill for newly admitted requests (each distinct
prompt once, and only past its longest prefix in the prefix cache), one decode step for the
running rows, token choice (:func:`pick_tokens`, one generator per sampled row), and the
delivery of finished rows.
The queue and the engine task that admits requests between decode steps are in
:mod:`.batching`.

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

import numpy as np
import torch
from tinker import types as tinker_types
from torch import Tensor

from trio_rl import _tinker_compat
from trio_rl.backends.local.prefix_cache import DEFAULT_MAX_BYTES, KV, Prefill, PrefixCache, look_up
from trio_rl.backends.local.requests import Request, Row, row_seed


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


def _to_f32(x: float) -> float:
    return float(np.float32(x))


def _deliver(row: Row, reason: tinker_types.StopReason, versioned: bool) -> None:
    request = row.request
    if request.cancelled or request.done.is_set():
        return
    versions = row.versions if versioned else None
    request.results[row.index] = _tinker_compat.sampled_sequence(row.tokens, row.logprobs, reason, versions)
    request.remaining -= 1
    if request.remaining == 0:
        request.done.set()


def _row_params(rows: Sequence[Row]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Each row's temperature, top-k, top-p, and its next uniform draw."""
    return (
        torch.tensor([r.request.temperature for r in rows], dtype=torch.float64),
        torch.tensor([r.request.top_k for r in rows]),
        torch.tensor([r.request.top_p for r in rows], dtype=torch.float64),
        torch.stack([torch.rand((), generator=r.generator, dtype=torch.float64) for r in rows]),
    )


class DecodeBatch:
    """The rows being decoded and the model side that a sampler subclass supplies.

    Args:
        prefix_cache_bytes: bound of the cache of prefilled prompts (``0``: none kept).
        version: the version of its weights (optimizer steps taken), recorded for each token.
    """

    def __init__(self, prefix_cache_bytes: int = DEFAULT_MAX_BYTES, *, version: int = 0) -> None:
        self._rows: list[Row] = []  # touched only by the engine task and its worker thread
        self._prefixes = PrefixCache(prefix_cache_bytes)
        self.version = version
        """The version of the weights that the next forward pass reads."""

    # ------------------------------------------------ model side (worker thread)

    def _select_weights(self) -> None:
        """Make this engine's weights the ones the next forward pass uses (if shared)."""

    def _refresh_cache(self) -> None:
        """Bring the running rows' cache up to the current weights, if a swap left it behind."""

    def _decode(self) -> Tensor:
        """One forward pass of every running row's last token; their next-token logits."""
        raise NotImplementedError

    def _prefill_prompts(self, prompts: list[list[int]], pasts: list[KV] | None = None) -> list[Prefill]:
        """One forward pass over distinct prompts; each one's keys, values and last logits (float64, CPU).

        Args:
            prompts: the prompts, at least one token each.
            pasts: for each prompt, the keys and values of fewer than all its
                first tokens, computed before (an empty list: none); the pass
                computes only the rest, attending to them.

        Returns:
            Each prompt's prefill: keys and values of all its tokens (possibly
            views of the pass's tensors) and the logits after its last token.
        """
        raise NotImplementedError

    def _append_rows(self, prefills: list[Prefill], repeats: list[int]) -> None:
        """Add ``repeats[i]`` rows starting from ``prefills[i]`` to the running cache, after the rows there."""
        raise NotImplementedError

    def _feed_tokens(self, tokens: Tensor) -> None:
        """Remember each row's chosen token: the next decode pass's input."""
        raise NotImplementedError

    def _keep_rows(self, keep: Tensor) -> None:
        """Keep only the cache rows at indices ``keep`` (in order); :meth:`_clear_rows` drops all."""
        raise NotImplementedError

    def _clear_rows(self) -> None:
        raise NotImplementedError

    def _score(self, tokens: list[int]) -> list[float]:
        """Logprob of each token after the first, given those before it."""
        raise NotImplementedError

    def _stop_string_hit(self, row: Row) -> bool:
        """Whether the row's text now contains one of its request's stop strings."""
        return False

    def _encode_stop_string(self, text: str) -> list[tuple[int, ...]] | None:
        """Token sequences to stop at for ``text``, or ``None`` to match it as text."""
        raise NotImplementedError

    _pick = staticmethod(pick_tokens)
    """Chooses each row's token; a subclass may put a faster equivalent here."""

    def _reset(self) -> None:
        self._rows = []
        self._clear_rows()

    def _new_rows(self, request: Request) -> None:
        """Append the rows of a newly admitted request, each with its own generator."""
        for index in range(request.num_samples):
            gen = torch.Generator().manual_seed(row_seed(request.seed, index))
            self._rows.append(Row(request=request, index=index, generator=gen))

    def _step(self, admit: list[Request]) -> list[tuple[Row, tinker_types.StopReason]]:
        """One engine iteration, in a worker thread: decode the running rows, prefill the admitted ones."""
        with torch.inference_mode():
            self._drop([i for i, row in enumerate(self._rows) if row.request.cancelled])
            # Every forward pass of this step reads these weights: in-flight
            # weights are swapped in between steps (InflightBatch.publish),
            # which also clears self._prefixes.
            self._select_weights()
            self._refresh_cache()
            logits = [self._decode()] if self._rows else []
            if admit:
                logits.append(self._prefill(admit))
            return self._choose(torch.cat(logits)) if logits else []

    def _prefill(self, admit: list[Request]) -> Tensor:
        """Rows for the admitted requests, each distinct prompt prefilled once past its longest cached prefix.

        Returns:
            The rows' first next-token logits.
        """
        found, todo = look_up(admit, self._prefixes)
        if todo:
            keys = list(todo)
            computed = self._prefill_prompts([list(k) for k in keys], [todo[k].kv for k in keys])
            for key, prefill in zip(keys, computed, strict=True):
                found[key] = prefill
                self._prefixes.put(key, prefill)
        prefills = [found[tuple(r.prompt)] for r in admit]
        repeats = [r.num_samples for r in admit]
        for request in admit:
            self._new_rows(request)
        self._append_rows(prefills, repeats)
        return torch.stack([p.logits for p in prefills]).repeat_interleave(torch.tensor(repeats), dim=0)

    def _choose(self, logits: Tensor) -> list[tuple[Row, tinker_types.StopReason]]:
        tokens, logprobs = self._pick(logits, *_row_params(self._rows))
        finished: list[tuple[Row, tinker_types.StopReason]] = []
        done: list[int] = []
        for i, (row, tok, lp) in enumerate(zip(self._rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            row.tokens.append(tok)
            row.logprobs.append(_to_f32(lp))
            row.versions.append(self.version)
            reason: tinker_types.StopReason | None = "stop" if row.stopped(self._stop_string_hit) else None
            if reason is None and len(row.tokens) >= row.request.max_new:
                reason = "length"
            if reason is not None:
                finished.append((row, reason))
                done.append(i)
        self._feed_tokens(tokens)
        self._drop(done)
        return finished

    def _drop(self, indices: Sequence[int]) -> None:
        if not indices:
            return
        gone = set(indices)
        keep = torch.tensor([i for i in range(len(self._rows)) if i not in gone], dtype=torch.long)
        self._rows = [row for i, row in enumerate(self._rows) if i not in gone]
        if self._rows:
            self._keep_rows(keep)
        else:
            self._reset()
