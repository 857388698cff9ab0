"""The HF training client: the local backend's request queue over a Hugging Face model.

``forward_backward`` uses the toy backend's losses and input checks
(:mod:`trio_rl.backends.local.batch_inputs`); only the logprobs come from the
HF model, a micro-batch at a time so that a long batch fits in memory.
``optim_step`` is the toy backend's Adam (:func:`~trio_rl.backends.local.optimizer.adam_step`)
over the trainable parameters: the LoRA adapter, or every weight.
"""

from __future__ import annotations

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
from trio_rl.backends.hf.sampler import HFSamplingClient, HFSamplingEngine, eos_token_ids
from trio_rl.backends.local.batch_inputs import (
    DatumInputs,
    forward_backward_parts,
    logprobs_at,
    micro_batches,
    parse_batch,
    right_padded,
    scored_positions,
)
from trio_rl.backends.local.batching import BatchingEngine
from trio_rl.backends.local.client_base import QueuedTrainingClient
from trio_rl.backends.local.optimizer import AdamState, adam_step
from trio_rl.backends.local.runtime import BackendRuntime

__all__ = ["HFTrainingClient", "TrainingSettings", "adam_on", "micro_batches", "target_logprobs"]


_SCALED_LOGITS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models whose forward changes the head's logits: these take the full forward."""


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
        parts = micro_batches(inputs, settings.token_budget)
        return forward_backward_parts(
            inputs, parts, lambda part: target_logprobs(policy.model, part, policy.device, loss_fn), loss_fn, config
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
            vocab_size=self._policy.vocab_size,
            max_seq_len=self._settings.max_seq_len,
            default_stop_ids=self._eos,
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
