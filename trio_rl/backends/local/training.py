"""The local training client: full-parameter training of the toy transformer.

The request methods and their ordered job queue are shared with the HF client
(:class:`~.client_base.QueuedTrainingClient`); this module is the model side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tinker import types as tinker_types
from torch import Tensor

from trio_rl import _tinker_compat
from trio_rl.backends.local.batch_inputs import (
    DatumInputs,
    MicroBatch,
    forward_backward_parts,
    logprobs_at,
    parse_batch,
    right_padded,
    scored_positions,
)
from trio_rl.backends.local.batching import BatchingEngine
from trio_rl.backends.local.checkpoint import load_checkpoint, save_checkpoint
from trio_rl.backends.local.client_base import QueuedTrainingClient
from trio_rl.backends.local.jobs import LocalPendingResult
from trio_rl.backends.local.model import TransformerLM, causal_mask
from trio_rl.backends.local.optimizer import AdamState, adam_step
from trio_rl.backends.local.runtime import BackendRuntime
from trio_rl.backends.local.sampler import LocalSamplingClient, SamplingEngine, frozen_copy
from trio_rl.backends.local.tokenizer import CharTokenizer

__all__ = ["LocalPendingResult", "LocalTrainingClient", "forward_backward_batch"]


def _target_logprobs(model: TransformerLM, inputs: list[DatumInputs], loss_fn: str) -> list[Tensor]:
    tokens, lengths = right_padded(inputs)
    width = tokens.shape[1]
    hidden, _ = model.hidden(tokens, torch.arange(width).expand(len(inputs), width), causal_mask(lengths, width))
    return logprobs_at(hidden, model.head, inputs, [scored_positions(d, loss_fn) for d in inputs])


def forward_backward_batch(
    model: TransformerLM,
    data: Sequence[tinker_types.Datum],
    loss_fn: str,
    loss_fn_config: Mapping[str, float],
) -> tinker_types.ForwardBackwardOutput:
    """Run one forward/backward pass over ``data``, adding to the parameters' gradients.

    All data go through the model as one right-padded batch; the loss is the sum
    over data of each datum's summed per-token loss (see :mod:`.losses`).

    Args:
        model: the float32 training model.
        data: each datum's ``model_input`` and ``loss_fn_inputs`` of the same length.
        loss_fn: one of :data:`.losses.LOSS_FUNCTIONS`.
        loss_fn_config: clip thresholds for ``ppo``/``cispo``.

    Returns:
        Per datum ``logprobs`` and ``elementwise_loss`` (float32, one per position;
        logprobs computed only where :func:`.batch_inputs.scored_positions` says)
        and the metric ``loss:sum``.

    Raises:
        ValueError: for missing inputs, mismatched lengths or out-of-range tokens.
    """
    if not data:
        return _tinker_compat.forward_backward_output([], {"loss:sum": 0.0})
    inputs = parse_batch(data, loss_fn, vocab_size=model.vocab_size, max_seq_len=model.config.max_seq_len)
    return forward_backward_parts(
        inputs,
        [MicroBatch(full=tuple(range(len(inputs))))],
        lambda part: _target_logprobs(model, [inputs[i] for i in part.rows], loss_fn),
        loss_fn,
        loss_fn_config,
    )


class LocalTrainingClient(QueuedTrainingClient[LocalSamplingClient]):
    """Trains a full-parameter copy of the model (LoRA rank is ignored locally).

    Get one from ``LocalBackend.create_training_client``.
    """

    def __init__(
        self,
        runtime: BackendRuntime,
        model: TransformerLM,
        tokenizer: CharTokenizer,
        adam: AdamState | None = None,
    ) -> None:
        super().__init__(runtime, tokenizer, adam)
        self._model = model

    @property
    def model(self) -> TransformerLM:
        """The live training model (for inspection; mutate it only through requests)."""
        return self._model

    def _forward_backward(
        self, data: list[tinker_types.Datum], loss_fn: str, config: Mapping[str, float]
    ) -> tinker_types.ForwardBackwardOutput:
        return forward_backward_batch(self._model, data, loss_fn, config)

    def _optim_step(self, adam_params: tinker_types.AdamParams) -> dict[str, float]:
        return adam_step(self._model, self._adam, adam_params)

    def _save(self, path: Path, adam: AdamState | None) -> None:
        save_checkpoint(
            path,
            weights=self._model.state_dict(),
            adam=adam,
            model_config=self._model.config,
            tokenizer=self._tokenizer,
            kind="sampler" if adam is None else "state",
        )

    def _freeze(self) -> TransformerLM:
        return frozen_copy(self._model)

    def _engine(self, weights: TransformerLM, *, inflight: bool, version: int) -> SamplingEngine:
        return SamplingEngine(weights, self._tokenizer, self._runtime, inflight=inflight, version=version)

    def _save_sampler(self, path: Path) -> None:
        self._save(path, None)

    def _client(self, engine: BatchingEngine[Any], path: str | None) -> LocalSamplingClient:
        return LocalSamplingClient(engine, path)

    def _write_state(self, path: Path) -> None:
        self._save(path, self._adam)

    def _read_state(self, path: Path, with_optimizer: bool) -> None:
        ckpt = load_checkpoint(path, with_optimizer=with_optimizer)
        if ckpt.model_config != self._model.config or ckpt.tokenizer != self._tokenizer:
            raise ValueError(f"{path} was saved from a model of another shape or tokenizer")
        self._model.load_state_dict(ckpt.weights)
        self._model.zero_grad(set_to_none=True)
        self._adam = ckpt.adam if ckpt.adam is not None else AdamState()

    async def get_tokenizer(self) -> CharTokenizer:
        """The tokenizer of the model being trained."""
        tokenizer: CharTokenizer = self._tokenizer
        return tokenizer
