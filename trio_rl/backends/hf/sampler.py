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
the same tokens alone and batched on the tiny model; the logprobs then agree
to about 1e-5 rather than bit for bit. In bfloat16 (GPU) the noise is far
larger and a seeded sample can diverge after a near-tie; pass
``dtype="float32"`` where exact repeats matter.

Stop strings are matched on decoded text (the tail of each row), not on token
sequences, since a BPE tokenizer can spell one string many ways.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

from trio_rl.backends.hf.policy import Snapshot
from trio_rl.backends.local.batching import BatchingEngine, Request, Row
from trio_rl.backends.local.runtime import BackendRuntime
from trio_rl.backends.local.sampler import LocalSamplingClient

_STOP_WINDOW_SLACK = 4
"""Extra tokens decoded beyond a stop string's length when looking for it."""


def _left_pad(t: Tensor, width: int, dim: int) -> Tensor:
    """Zero-pad ``t`` on the left of ``dim`` up to ``width``."""
    have = t.shape[dim]
    if have == width:
        return t
    shape = list(t.shape)
    shape[dim] = width - have
    return torch.cat([t.new_zeros(shape), t], dim=dim)


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


def cache_keyword(model: Any) -> str:
    """The forward argument (and output field) of the KV cache: ``cache`` since
    transformers 5.2x renamed it, ``past_key_values`` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class HFSamplingEngine(BatchingEngine):
    """Serves ``sample`` and ``compute_logprobs`` for one snapshot of a HF model.

    Args:
        snapshot: the frozen weights (activated before every forward pass).
        tokenizer: the HF tokenizer (decodes rows to match stop strings).
        runtime: the backend's nursery, thread limiter and seed source.
        vocab_size: token ids must lie below this.
        max_seq_len: prompt plus sample never exceed this.
        default_stop_ids: stops of a request whose ``stop`` is ``None``.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        tokenizer: Any,
        runtime: BackendRuntime,
        *,
        vocab_size: int,
        max_seq_len: int,
        default_stop_ids: frozenset[int],
    ) -> None:
        super().__init__(runtime, vocab_size=vocab_size, max_seq_len=max_seq_len, default_stop_ids=default_stop_ids)
        self._snapshot = snapshot
        self._tokenizer = tokenizer
        self._device = next(snapshot.model.parameters()).device
        self._cache_kw = cache_keyword(snapshot.model)
        self._cache: list[tuple[Tensor, Tensor]] = []
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._lengths = torch.zeros(0, dtype=torch.long)
        self._last = torch.zeros(0, dtype=torch.long)

    # --------------------------------------------------------------- stops

    def _encode_stop_string(self, text: str) -> list[tuple[int, ...]] | None:
        return None  # matched as text: see _stop_string_hit

    def _stop_string_hit(self, row: Row) -> bool:
        strings = row.request.stop_strings
        window = max(len(s) for s in strings) + _STOP_WINDOW_SLACK
        tail = self._tokenizer.decode(row.tokens[-window:])
        return any(s in tail for s in strings)

    # --------------------------------------------------------------- model

    def _run_model(
        self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, cache: list[tuple[Tensor, Tensor]]
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """One forward pass; returns last-position logits (float64, CPU) and the grown cache."""
        from transformers import DynamicCache

        past = DynamicCache()
        for layer, (k, v) in enumerate(cache):
            past.update(k, v, layer)
        dev = self._device
        out = self._snapshot.model(
            input_ids=input_ids.to(dev),
            attention_mask=attention_mask.to(dev),
            position_ids=position_ids.to(dev),
            use_cache=True,
            **{self._cache_kw: past},
        )
        grown = getattr(out, self._cache_kw)
        new_cache = [(layer.keys, layer.values) for layer in grown.layers]
        return out.logits[:, -1].to("cpu", torch.float64), new_cache

    def _select_weights(self) -> None:
        self._snapshot.activate()

    def _decode(self) -> Tensor:
        rows = len(self._rows)
        mask = torch.cat([self._mask, torch.ones(rows, 1, dtype=torch.long)], dim=1)
        logits, self._cache = self._run_model(self._last[:, None], mask, self._lengths[:, None], self._cache)
        self._mask = mask
        self._lengths = self._lengths + 1
        return logits

    def _prefill(self, admit: list[Request]) -> Tensor:
        lengths = torch.tensor([len(r.prompt) for r in admit])
        width = int(lengths.max())
        tokens = torch.zeros(len(admit), width, dtype=torch.long)
        mask = torch.zeros(len(admit), width, dtype=torch.long)
        for i, request in enumerate(admit):
            tokens[i, width - len(request.prompt):] = torch.tensor(request.prompt)
            mask[i, width - len(request.prompt):] = 1
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        last, kv = self._run_model(tokens, mask, positions, [])
        # Every sample of a request starts from the same prompt: prefill once, copy rows.
        repeats = torch.tensor([r.num_samples for r in admit])
        index = torch.arange(len(admit)).repeat_interleave(repeats)
        kv = [(k[index.to(k.device)], v[index.to(v.device)]) for k, v in kv]
        mask, lengths = mask[index], lengths[index]
        for request in admit:
            self._new_rows(request)
        if self._cache:
            slots = max(self._mask.shape[1], width)
            self._cache = [
                (torch.cat([_left_pad(k0, slots, 2), _left_pad(k1, slots, 2)]),
                 torch.cat([_left_pad(v0, slots, 2), _left_pad(v1, slots, 2)]))
                for (k0, v0), (k1, v1) in zip(self._cache, kv)
            ]
            self._mask = torch.cat([_left_pad(self._mask, slots, 1), _left_pad(mask, slots, 1)])
        else:
            self._cache, self._mask = kv, mask
        self._lengths = torch.cat([self._lengths, lengths])
        self._last = torch.cat([self._last, torch.zeros(len(lengths), dtype=torch.long)])
        return last[index]

    def _feed_tokens(self, tokens: Tensor) -> None:
        self._last = tokens

    def _clear_rows(self) -> None:
        self._cache = []
        self._mask = torch.zeros(0, 0, dtype=torch.long)
        self._lengths = torch.zeros(0, dtype=torch.long)
        self._last = torch.zeros(0, dtype=torch.long)

    def _keep_rows(self, keep: Tensor) -> None:
        mask = self._mask.index_select(0, keep)
        # Cut the leading columns that only finished rows used.
        start = int(mask.any(0).long().argmax())
        self._mask = mask[:, start:]
        self._cache = [
            (k.index_select(0, keep.to(k.device))[:, :, start:], v.index_select(0, keep.to(v.device))[:, :, start:])
            for k, v in self._cache
        ]
        self._lengths = self._lengths.index_select(0, keep)
        self._last = self._last.index_select(0, keep)

    def _score(self, tokens: list[int]) -> list[float]:
        self._snapshot.activate()
        dev = self._device
        x = torch.tensor([tokens], device=dev)
        logits = self._snapshot.model(input_ids=x, use_cache=False).logits[0, :-1].double()
        logp = torch.log_softmax(logits, dim=-1).gather(1, x[0, 1:, None])[:, 0]
        return [float(v) for v in logp.cpu().tolist()]


class HFSamplingClient(LocalSamplingClient):
    """A sampling client pinned to one snapshot of an HF training client's weights.

    Created by ``HFTrainingClient.save_weights_for_sampler``; later optimizer
    steps never change what it samples. ``sample`` behaves as the local
    backend's, except that ``stop`` strings are matched on decoded text, and
    ``stop=None`` stops at the model's EOS tokens.
    """
