"""The HF training client: the local backend's request queue over a Hugging Face model.

``forward_backward`` uses the toy backend's losses and input checks
(:mod:`trio_rl.backends.local.batch_inputs`); only the logprobs come from the
HF model, a micro-batch at a time so that a long batch fits in memory. Data
that start alike (a GRPO group's samples of one prompt, a conversation's turns)
run their shared prefix once, forward and backward: its keys and values are
reused by every row of the group, which gives the same logprobs and gradients
as running each datum whole, up to float rounding.
``optim_step`` is the toy backend's Adam (:func:`~trio_rl.backends.local.optimizer.adam_step`)
over the trainable parameters: the LoRA adapter, or every weight.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tinker import types as tinker_types
from torch import Tensor

from trio_rl import _tinker_compat
from trio_rl.backends.hf.checkpoint import load_hf_checkpoint, save_hf_checkpoint
from trio_rl.backends.hf.loading import ModelSource
from trio_rl.backends.hf.policy import Policy, Snapshot
from trio_rl.backends.hf.sampler import HFSamplingClient, HFSamplingEngine, cache_keyword, eos_token_ids
from trio_rl.backends.local.batch_inputs import (
    DatumInputs,
    MicroBatch,
    PrefixGroup,
    forward_backward_parts,
    logprobs_at,
    logprobs_of,
    micro_batches,
    parse_batch,
    right_padded,
    scored_positions,
)
from trio_rl.backends.local.batching import BatchingEngine
from trio_rl.backends.local.client_base import QueuedTrainingClient
from trio_rl.backends.local.optimizer import AdamState, adam_step
from trio_rl.backends.local.requests import Limits
from trio_rl.backends.local.runtime import BackendRuntime

__all__ = [
    "MIN_SHARED_PREFIX",
    "HFTrainingClient",
    "TrainingSettings",
    "adam_on",
    "micro_batches",
    "part_logprobs",
    "shared_target_logprobs",
    "shares_prefixes",
    "target_logprobs",
]


_SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models whose forward changes the head's logits: these take the full forward."""

MIN_SHARED_PREFIX = 8
"""Fewest leading tokens two or more data of a micro-batch must share for the prefix to run once.

Sharing costs one more forward pass (and its backward) per micro-batch, for all
of its groups together; a shorter common prefix saves less than that.
"""

_MASKS_WITH_HOLES = ("sdpa", "eager")
"""Attention implementations that take any 2D padding mask: the groups' prefixes are right-padded."""


def target_logprobs(model: Any, inputs: Sequence[DatumInputs], device: torch.device, loss_fn: str) -> list[Tensor]:
    """Each datum's float32 target logprobs, one right-padded forward pass, the head only where scored.

    The output head (a vocabulary-sized matmul per position) runs only at the
    positions :func:`~trio_rl.backends.local.batch_inputs.scored_positions`
    keeps; a model that rescales its logits runs in full, and is then scored there.
    """
    tokens, lengths = right_padded(inputs)
    mask = (torch.arange(tokens.shape[1])[None, :] < lengths[:, None]).long()
    keep = [scored_positions(d, loss_fn) for d in inputs]
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    args = {"input_ids": tokens.to(device), "attention_mask": mask.to(device), "use_cache": False}
    if head is None or any(getattr(base.config, k, None) for k in _SCALED_LOGITS):
        logits = model(**args).logits
        return logprobs_at(logits, lambda x: x, inputs, keep)
    hidden = getattr(base, base.base_model_prefix)(**args).last_hidden_state
    return logprobs_at(hidden, head, inputs, keep)


def _parts(model: Any) -> tuple[Any, Any, Any]:
    """The causal LM under any peft wrapper, its transformer body, and its output head (or ``None``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base, getattr(base, base.base_model_prefix), base.get_output_embeddings()


def shares_prefixes(model: Any) -> bool:
    """Whether ``model`` can run a prefix once for several data (:func:`shared_target_logprobs`).

    It can when every layer attends over all earlier positions (no sliding
    window, no linear attention or recurrent state, whose cache is not plain
    keys and values), its head's logits are used as they are, and its attention
    takes a padding mask with holes. Any other model runs every datum whole.
    """
    base, body, head = _parts(model)
    config = base.config
    if head is None or any(getattr(config, k, None) for k in _SCALED_LOGITS):
        return False
    if getattr(config, "_attn_implementation", None) not in _MASKS_WITH_HOLES:
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    if layer_types is None and getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    return cache_keyword(body) in inspect.signature(body.forward).parameters


def shared_target_logprobs(
    model: Any, inputs: Sequence[DatumInputs], groups: Sequence[PrefixGroup], device: torch.device, loss_fn: str
) -> list[Tensor] | None:
    """The target logprobs of the groups' rows (in order), each group's prefix run once.

    One forward pass runs the groups' prefixes (right-padded) with a KV cache;
    each group's keys and values are then repeated for its rows, so that their
    gradients add up over the rows in the backward pass; a second pass runs
    each row's remaining tokens (right-padded, positions continuing after its
    prefix) over that cache. A position's hidden state comes from the prefix
    pass below its group's length and from the row's own pass after it; the
    head runs only where :func:`~trio_rl.backends.local.batch_inputs.scored_positions` keeps.

    Returns:
        One ``[len]`` tensor per row, as :func:`target_logprobs` gives; ``None``
        if the model's cache is not plain keys and values per layer (nothing
        was run backward; run the rows whole).
    """
    from transformers import DynamicCache

    _, body, head = _parts(model)
    kw = cache_keyword(body)
    lengths = torch.tensor([g.length for g in groups])
    width = int(lengths.max())
    prefixes = torch.zeros(len(groups), width, dtype=torch.long)
    for k, g in enumerate(groups):
        prefixes[k, : g.length] = torch.tensor(inputs[g.rows[0]].tokens[: g.length])
    prefix_mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    cache = DynamicCache()
    args = {"input_ids": prefixes.to(device), "attention_mask": prefix_mask.to(device), kw: cache}
    prefix_hidden = body(**args, use_cache=True).last_hidden_state
    owner = torch.tensor([k for k, g in enumerate(groups) for _ in g.rows])
    if not _repeat_rows(cache, owner.to(device), len(groups)):
        return None
    rows = [inputs[i] for g in groups for i in g.rows]
    starts = lengths[owner]
    tails, tail_lengths = right_padded([DatumInputs(d.tokens[int(s) :], {}) for d, s in zip(rows, starts, strict=True)])
    span = tails.shape[1]
    mask = torch.cat([prefix_mask[owner], (torch.arange(span)[None, :] < tail_lengths[:, None]).long()], dim=1)
    args = {"input_ids": tails.to(device), "attention_mask": mask.to(device), kw: cache}
    positions = (starts[:, None] + torch.arange(span)[None, :]).to(device)
    tail_hidden = body(**args, position_ids=positions, use_cache=True).last_hidden_state
    keep = [scored_positions(d, loss_fn) for d in rows]
    # Row r's position c, in the prefixes' hidden states then the tails' (flattened one after the other).
    index = []
    for r, kept in enumerate(keep):
        cols, start = kept.nonzero()[:, 0], int(starts[r])
        index.append(torch.where(cols < start, owner[r] * width + cols, len(groups) * width + r * span + cols - start))
    flat = torch.cat([prefix_hidden.flatten(0, 1), tail_hidden.flatten(0, 1)])
    return logprobs_of(flat[torch.cat(index).to(device)], head, rows, keep)


def _repeat_rows(cache: Any, owner: Tensor, prefixes: int) -> bool:
    """Repeat each prefix's keys and values for the rows ``owner`` names; ``False`` where the cache is not plain."""
    from transformers.cache_utils import DynamicLayer

    layers = list(getattr(cache, "layers", []))
    plain = all(
        type(layer) is DynamicLayer and isinstance(layer.keys, Tensor) and layer.keys.shape[0] == prefixes
        for layer in layers
    )
    if not layers or not plain:
        return False
    for layer in layers:
        layer.keys = layer.keys.index_select(0, owner)
        layer.values = layer.values.index_select(0, owner)
    return True


def part_logprobs(
    model: Any, inputs: Sequence[DatumInputs], part: MicroBatch, device: torch.device, loss_fn: str
) -> list[Tensor]:
    """The target logprobs of a micro-batch's rows, in the order of ``part.rows``."""
    whole = target_logprobs(model, [inputs[i] for i in part.full], device, loss_fn) if part.full else []
    if not part.shared:
        return whole
    shared = shared_target_logprobs(model, inputs, part.shared, device, loss_fn)
    if shared is None:
        shared = target_logprobs(model, [inputs[i] for g in part.shared for i in g.rows], device, loss_fn)
    return whole + shared


def adam_on(adam: AdamState, device: torch.device) -> AdamState:
    """``adam`` with its moments moved to ``device``."""
    return AdamState(
        step=adam.step,
        exp_avg={k: v.to(device) for k, v in adam.exp_avg.items()},
        exp_avg_sq={k: v.to(device) for k, v in adam.exp_avg_sq.items()},
    )


@dataclass(frozen=True)
class TrainingSettings:
    """What a training client needs to know beyond its weights."""

    source: ModelSource
    max_seq_len: int
    token_budget: int


class HFTrainingClient(QueuedTrainingClient[HFSamplingClient]):
    """Trains a LoRA adapter (or every weight) of a Hugging Face causal LM.

    Get one from ``HFBackend.create_training_client``. Requests run in
    submission order in a worker thread, as on the local backend. Under LoRA a
    sampler's snapshot is an extra adapter on the shared base model, and its
    folder is in peft's layout.
    """

    def __init__(
        self,
        runtime: BackendRuntime,
        policy: Policy,
        tokenizer: Any,
        settings: TrainingSettings,
        adam: AdamState | None = None,
    ) -> None:
        super().__init__(runtime, tokenizer, adam)
        self._policy = policy
        self._settings = settings
        self._eos = eos_token_ids(policy.model, tokenizer)
        self._shares_prefixes = shares_prefixes(policy.model)

    @property
    def model(self) -> Any:
        """The live model (a ``PeftModel`` under LoRA); mutate it only through requests."""
        return self._policy.model

    @property
    def policy(self) -> Policy:
        """The trained weights and their snapshots (for inspection)."""
        return self._policy

    def _forward_backward(
        self, data: list[tinker_types.Datum], loss_fn: str, config: Mapping[str, float]
    ) -> tinker_types.ForwardBackwardOutput:
        if not data:
            return _tinker_compat.forward_backward_output([], {"loss:sum": 0.0})
        policy, settings = self._policy, self._settings
        inputs = parse_batch(data, loss_fn, vocab_size=policy.vocab_size, max_seq_len=settings.max_seq_len)
        policy.activate()
        min_prefix = MIN_SHARED_PREFIX if self._shares_prefixes else 0
        parts = micro_batches(inputs, settings.token_budget, min_prefix=min_prefix)
        return forward_backward_parts(
            inputs,
            parts,
            lambda part: part_logprobs(policy.model, inputs, part, policy.device, loss_fn),
            loss_fn,
            config,
        )

    def _optim_step(self, adam_params: tinker_types.AdamParams) -> dict[str, float]:
        self._policy.activate()
        return adam_step(self._policy.model, self._adam, adam_params)

    def _freeze(self) -> Snapshot:
        return self._policy.snapshot()

    def _engine(self, weights: Snapshot, *, inflight: bool, version: int) -> HFSamplingEngine:
        return HFSamplingEngine(
            weights,
            self._tokenizer,
            self._runtime,
            limits=Limits(self._policy.vocab_size, self._settings.max_seq_len, self._eos),
            inflight=inflight,
            version=version,
        )

    def _save_sampler(self, path: Path) -> None:
        save_hf_checkpoint(path, self._policy, self._settings.source, None, "sampler")

    def _client(self, engine: BatchingEngine[Any], path: str | None) -> HFSamplingClient:
        return HFSamplingClient(engine, path)

    def _write_state(self, path: Path) -> None:
        save_hf_checkpoint(path, self._policy, self._settings.source, self._adam, "state")

    def _read_state(self, path: Path, with_optimizer: bool) -> None:
        ckpt = load_hf_checkpoint(path, with_optimizer=with_optimizer)
        if ckpt.lora_rank != self._policy.lora_rank:
            raise ValueError(f"{path} has lora_rank {ckpt.lora_rank}, this client {self._policy.lora_rank}")
        self._policy.activate()
        self._policy.load_trained_state(ckpt.weights)
        self._adam = adam_on(ckpt.adam, self._policy.device) if ckpt.adam is not None else AdamState()
