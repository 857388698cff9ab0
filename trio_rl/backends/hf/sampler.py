"""Batched, KV-cached sampling from a Hugging Face causal LM.

The request queue, token choice, stops and delivery are the toy engine's
(:class:`~trio_rl.backends.local.batching.BatchingEngine`); this module is the
model side. Concurrent ``sample`` calls share decode steps: each engine
iteration runs ONE forward pass of every running row (its last token) and one
prefill pass of the newly admitted prompts, then picks every row's next token.

Rows of different lengths share one HF ``DynamicCache`` by LEFT padding: the
cache is ``[rows, kv_heads, width, head_dim]`` per layer, each row's tokens sit
at its right end, and a ``[rows, width]`` attention mask marks the real slots.
Position ids are per row (its own length), so padding changes no position.
A newly prefilled group is left-padded to the running width (or the running
rows to its width) and concatenated; finished rows are dropped, and leading
columns that no remaining row uses are cut off.

Determinism: each sampled row has its own generator seeded from (request seed,
sample index), and token choice reads float64 copies of the logits, row by row.
The forward pass runs in the model's dtype (float32 on CPU), where a row's
logits depend in the last bits on what else is in the batch (matmul shapes and
padding differ). ``tests/test_hf_sampler.py`` checks that seeded requests give
the same tokens alone and batched with requests of other lengths on the tiny
model, with logprobs equal to within 1e-4 (not bit for bit). In bfloat16 (GPU)
the noise is larger and a seeded sample may take another token after a
near-tie (not measured here: no GPU); pass ``dtype="float32"`` where exact
repeats matter.

Stop strings are matched on decoded text (the tail of each row), not on token
sequences, since a BPE tokenizer can spell one string many ways.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from trio_rl.backends.hf.policy import Snapshot
from trio_rl.backends.hf.running_rows import RunningRows, left_aligned_mask, left_pad
from trio_rl.backends.local.batching import BatchingEngine, pick_tokens
from trio_rl.backends.local.prefix_cache import KV, Prefill
from trio_rl.backends.local.requests import Limits, Row
from trio_rl.backends.local.runtime import BackendRuntime
from trio_rl.backends.local.sampler import LocalSamplingClient

_STOP_WINDOW_SLACK = 4
"""Extra tokens decoded beyond a stop string's length when looking for it."""


def pick_tokens_unsorted(
    logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, uniform: Tensor
) -> tuple[Tensor, Tensor]:
    """:func:`~trio_rl.backends.local.batching.pick_tokens` without the vocabulary sort where it is not needed.

    Rows with no top-k/top-p truncation (and greedy rows) draw by inverse CDF
    over the tokens in id order; sorting a 50k vocabulary for 64 rows costs
    more than the small model's decode step on a CPU. Truncated rows go
    through :func:`pick_tokens`. Same distribution and the same logprobs; for
    one uniform draw, a different token than :func:`pick_tokens` would give.
    """
    vocab = logits.shape[-1]
    greedy = (temperature <= 0) | (top_k == 1)
    truncated = ~greedy & (((top_k > 0) & (top_k < vocab)) | (top_p < 1.0))
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    # Dividing by 1 changes no bit: the common all-temperature-1 batch skips a pass over the vocabulary.
    scaled = logits if bool((scale == 1).all()) else logits / scale[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    cdf = logp.exp().cumsum_(dim=-1)
    drawn = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)[:, 0].clamp_(max=vocab - 1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), drawn) if bool(greedy.any()) else drawn
    if truncated.any():
        rows = truncated.nonzero()[:, 0]
        picked, _ = pick_tokens(logits[rows], temperature[rows], top_k[rows], top_p[rows], uniform[rows])
        tokens[rows] = picked
    return tokens, logp.gather(1, tokens[:, None])[:, 0]


def eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """The tokens that end a generation by default: the tokenizer's and generation config's EOS."""
    ids: set[int] = set()
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(int(e) for e in eos)
    return frozenset(ids)


def keeps_last_logits(model: Any) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (the output head on the last positions only)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "logits_to_keep" in inspect.signature(base.forward).parameters


def cache_keyword(model: Any) -> str:
    """The forward argument (and output field) of the KV cache: ``cache`` since
    transformers 5.2x renamed it, ``past_key_values`` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class HFSamplingEngine(BatchingEngine[Snapshot]):
    """Serves ``sample`` and ``compute_logprobs`` for one snapshot of a HF model, or in-flight snapshots.

    Args:
        snapshot: the frozen weights (activated before every forward pass).
        tokenizer: the HF tokenizer (decodes rows to match stop strings).
        runtime: the backend's nursery, thread limiter and seed source.
        limits: the vocabulary size token ids must lie below, the most tokens of
            prompt plus sample, and the stops of a request whose ``stop`` is ``None``.
        inflight: an in-flight engine (:meth:`publish` replaces ``snapshot``).
        version: the version of ``snapshot`` (optimizer steps taken).
    """

    def __init__(
        self,
        snapshot: Snapshot,
        tokenizer: Any,
        runtime: BackendRuntime,
        *,
        limits: Limits,
        inflight: bool = False,
        version: int = 0,
    ) -> None:
        super().__init__(runtime, limits=limits, inflight=inflight, version=version)
        self._snapshot = snapshot
        self._tokenizer = tokenizer
        self._device = next(snapshot.model.parameters()).device
        self._cache_kw = cache_keyword(snapshot.model)
        # Only the last position's logits are read: a prefill never computes the head elsewhere.
        self._last_only: dict[str, int] = {"logits_to_keep": 1} if keeps_last_logits(snapshot.model) else {}
        self._batch_rows = RunningRows(self._device)

    # --------------------------------------------------------------- stops

    def _encode_stop_string(self, text: str) -> list[tuple[int, ...]] | None:
        return None  # matched as text: see _stop_string_hit

    def _stop_string_hit(self, row: Row) -> bool:
        strings = row.request.stop_strings
        window = max(len(s) for s in strings) + _STOP_WINDOW_SLACK
        tail = self._tokenizer.decode(row.tokens[-window:])
        return any(s in tail for s in strings)

    # --------------------------------------------------------------- model

    def _run_model(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, past: Any) -> Tensor:
        """One forward pass, growing ``past`` (a ``DynamicCache``) in place; last-position logits (float64, CPU)."""
        dev = self._device
        out = self._snapshot.model(
            input_ids=input_ids.to(dev),
            attention_mask=attention_mask.to(dev),
            position_ids=position_ids.to(dev),
            use_cache=True,
            **{self._cache_kw: past},
            **self._last_only,
        )
        logits: Tensor = out.logits[:, -1].to("cpu", torch.float64)
        return logits

    def _select_weights(self) -> None:
        self._snapshot.activate()

    def _use_weights(self, weights: Snapshot) -> None:
        # Dropping the old snapshot hands its adapter back to the policy for reuse.
        self._snapshot = weights

    def _decode(self) -> Tensor:
        running = self._batch_rows
        mask = running.grown_mask(len(self._rows))
        logits = self._run_model(running.last[:, None], mask, running.lengths[:, None], running.past)
        running.stepped(mask)
        return logits

    def _prefill_prompts(self, prompts: list[list[int]], pasts: list[KV] | None = None) -> list[Prefill]:
        from transformers import DynamicCache

        # Row i is [its cached tokens, left-padded to `held`][its new tokens, left-padded to
        # `width`]: a padding hole between the two is masked out, and the last column holds
        # every row's last token. Position ids continue from the cached tokens.
        kv_in = pasts if pasts is not None else [[] for _ in prompts]
        done = [kv[0][0].shape[2] if kv else 0 for kv in kv_in]
        todo = [len(p) - n for p, n in zip(prompts, done, strict=True)]
        held, width = max(done), max(todo)
        new_mask = left_aligned_mask(todo, width)
        tokens = torch.zeros_like(new_mask)
        tokens[new_mask.bool()] = torch.tensor([t for p, n in zip(prompts, done, strict=True) for t in p[n:]])
        positions = (torch.tensor(done)[:, None] + new_mask.cumsum(1) - 1).clamp(min=0)
        past = DynamicCache()
        mask = new_mask
        if held:
            some = next(kv for kv in kv_in if kv)
            for layer in range(len(some)):
                keys, values = (
                    torch.cat([left_pad(kv[layer][j] if kv else some[layer][j][:, :, :0], held, 2) for kv in kv_in])
                    for j in (0, 1)
                )
                past.update(keys, values, layer)
            mask = torch.cat([left_aligned_mask(done, held), new_mask], dim=1)
        last = self._run_model(tokens, mask, positions, past)
        layers: list[Any] = list(past.layers)  # full-attention layers: keys and values are tensors

        def row(x: Tensor, i: int) -> Tensor:
            return torch.cat([x[i : i + 1, :, held - done[i] : held], x[i : i + 1, :, held + width - todo[i] :]], dim=2)

        return [Prefill([(row(x.keys, i), row(x.values, i)) for x in layers], last[i]) for i in range(len(prompts))]

    def _append_rows(self, prefills: list[Prefill], repeats: list[int]) -> None:
        self._batch_rows.append(prefills, repeats)

    def _feed_tokens(self, tokens: Tensor) -> None:
        self._batch_rows.last = tokens

    def _clear_rows(self) -> None:
        self._batch_rows.clear()

    def _keep_rows(self, keep: Tensor) -> None:
        self._batch_rows.keep(keep)

    _pick = staticmethod(pick_tokens_unsorted)

    def _score(self, tokens: list[int]) -> list[float]:
        self._snapshot.activate()
        dev = self._device
        x = torch.tensor([tokens], device=dev)
        logits = self._snapshot.model(input_ids=x, use_cache=False).logits[0, :-1].double()
        logp = torch.log_softmax(logits, dim=-1).gather(1, x[0, 1:, None])[:, 0]
        return [float(v) for v in logp.cpu().tolist()]


class HFSamplingClient(LocalSamplingClient):
    """A sampling client pinned to one snapshot of an HF training client's weights, or following its in-flight ones.

    Created by ``HFTrainingClient.save_weights_for_sampler``; a snapshot client's
    weights never change, an in-flight one's follow the training client's
    in-flight weights as the local backend's do. ``sample`` behaves as the local
    backend's, except that ``stop`` strings are matched on decoded text, and
    ``stop=None`` stops at the model's EOS tokens.
    """
