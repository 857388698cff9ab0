"""The HF training client: the local backend's ordered job queue over a Hugging Face model.

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
from trio_rl.backends.hf.policy import Policy
from trio_rl.backends.hf.sampler import HFSamplingClient, HFSamplingEngine, eos_token_ids
from trio_rl.backends.local.batch_inputs import DatumInputs, datum_losses, datum_outputs, parse_batch
from trio_rl.backends.local.checkpoint import check_name
from trio_rl.backends.local.jobs import JobQueue, LocalPendingResult
from trio_rl.backends.local.losses import check_loss_fn
from trio_rl.backends.local.optimizer import AdamState, adam_step
from trio_rl.backends.local.runtime import BackendRuntime


def micro_batches(inputs: Sequence[DatumInputs], token_budget: int) -> list[list[int]]:
    """Split data (in order) into runs whose padded size ``rows * longest`` fits ``token_budget``.

    A datum longer than the budget gets a micro-batch of its own.
    """
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, datum in enumerate(inputs):
        width = max(longest, len(datum.tokens))
        if current and width * (len(current) + 1) > token_budget:
            batches.append(current)
            current, width = [], len(datum.tokens)
        current.append(i)
        longest = width
    if current:
        batches.append(current)
    return batches


def target_logprobs(model: Any, inputs: Sequence[DatumInputs], device: torch.device) -> list[Tensor]:
    """Each datum's float32 logprobs of its target tokens, one right-padded forward pass."""
    width = max(len(d.tokens) for d in inputs)
    tokens = torch.zeros(len(inputs), width, dtype=torch.long)
    targets = torch.zeros(len(inputs), width, dtype=torch.long)
    mask = torch.zeros(len(inputs), width, dtype=torch.long)
    for i, datum in enumerate(inputs):
        n = len(datum.tokens)
        tokens[i, :n] = torch.tensor(datum.tokens)
        targets[i, :n] = datum.targets
        mask[i, :n] = 1
    logits = model(input_ids=tokens.to(device), attention_mask=mask.to(device), use_cache=False).logits.float()
    # logsumexp then gather: no [rows, width, vocab] log_softmax tensor kept for backward.
    picked = logits.gather(2, targets.to(device)[:, :, None])[:, :, 0]
    logprobs = picked - torch.logsumexp(logits, dim=-1)
    return [logprobs[i, : len(d.tokens)] for i, d in enumerate(inputs)]


@dataclass(frozen=True)
class TrainingSettings:
    """What a training client needs to know beyond its weights."""

    source: ModelSource
    max_seq_len: int
    token_budget: int


class HFTrainingClient:
    """Trains a LoRA adapter (or every weight) of a Hugging Face causal LM.

    Get one from ``HFBackend.create_training_client``. Requests run in
    submission order in a worker thread, as on the local backend.
    """

    def __init__(
        self,
        runtime: BackendRuntime,
        policy: Policy,
        tokenizer: Any,
        settings: TrainingSettings,
        adam: AdamState | None = None,
    ) -> None:
        self._runtime = runtime
        self._policy = policy
        self._tokenizer = tokenizer
        self._settings = settings
        self._adam = adam if adam is not None else AdamState()
        self._jobs = JobQueue(runtime)
        self._eos = eos_token_ids(policy.model, tokenizer)

    @property
    def model(self) -> Any:
        """The live model (a ``PeftModel`` under LoRA); mutate it only through requests."""
        return self._policy.model

    @property
    def policy(self) -> Policy:
        """The trained weights and their snapshots (for inspection)."""
        return self._policy

    @property
    def adam_state(self) -> AdamState:
        """The live optimizer state (for inspection)."""
        return self._adam

    def _forward_backward(
        self, data: list[tinker_types.Datum], loss_fn: str, config: Mapping[str, float]
    ) -> tinker_types.ForwardBackwardOutput:
        if not data:
            return _tinker_compat.forward_backward_output([], {"loss:sum": 0.0})
        policy = self._policy
        inputs = parse_batch(data, loss_fn, vocab_size=policy.vocab_size, max_seq_len=self._settings.max_seq_len)
        policy.activate()
        logprobs: list[Tensor] = [torch.empty(0)] * len(inputs)
        losses: list[Tensor] = [torch.empty(0)] * len(inputs)
        total = 0.0
        for batch in micro_batches(inputs, self._settings.token_budget):
            part = [inputs[i] for i in batch]
            with torch.enable_grad():
                rows = target_logprobs(policy.model, part, policy.device)
                per_datum = datum_losses(rows, part, loss_fn, config)
                loss = torch.stack([x.sum() for x in per_datum]).sum()
                loss.backward()  # type: ignore[no-untyped-call]
            total += float(loss.detach())
            for i, lp, x in zip(batch, rows, per_datum, strict=True):
                logprobs[i], losses[i] = lp.detach(), x.detach()
        return _tinker_compat.forward_backward_output(datum_outputs(logprobs, losses), {"loss:sum": total})

    async def forward_backward(
        self,
        data: Sequence[tinker_types.Datum],
        loss_fn: tinker_types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
    ) -> LocalPendingResult[tinker_types.ForwardBackwardOutput]:
        """Submit a forward/backward pass whose gradients add up until :meth:`optim_step`.

        Args:
            data: the batch; run in micro-batches of at most ``token_budget``
                padded tokens, so its size is bounded only by time.
            loss_fn: ``cross_entropy``, ``importance_sampling``, ``ppo`` or ``cispo``
                (the local backend's definitions).
            loss_fn_config: ``clip_low_threshold``/``clip_high_threshold`` for ``ppo``/``cispo``.

        Returns:
            A pending result with per-datum ``logprobs`` and ``elementwise_loss``
            and the ``loss:sum`` metric.

        Raises:
            ValueError: at once for an unsupported loss or config key; from
                ``result()`` for malformed data.
            RuntimeError: if the backend is not entered.
        """
        check_loss_fn(loss_fn, loss_fn_config)
        batch, config = list(data), dict(loss_fn_config or {})
        return self._jobs.submit(lambda: self._forward_backward(batch, loss_fn, config))

    async def optim_step(
        self, adam_params: tinker_types.AdamParams
    ) -> LocalPendingResult[tinker_types.OptimStepResponse]:
        """Submit one AdamW step: every ``AdamParams`` field (lr, betas, eps,
        decoupled weight decay, global-norm clipping) applies to this step.

        Returns:
            A pending result whose metrics hold ``grad_norm`` (before clipping) and ``learning_rate``.

        Raises:
            RuntimeError: if the backend is not entered.
        """

        def step() -> tinker_types.OptimStepResponse:
            self._policy.activate()
            return tinker_types.OptimStepResponse(metrics=adam_step(self._policy.model, self._adam, adam_params))

        return self._jobs.submit(step)

    def _engine(self) -> HFSamplingEngine:
        return HFSamplingEngine(
            self._policy.snapshot(),
            self._tokenizer,
            self._runtime,
            vocab_size=self._policy.vocab_size,
            max_seq_len=self._settings.max_seq_len,
            default_stop_ids=self._eos,
        )

    async def save_weights_for_sampler(self, name: str) -> HFSamplingClient:
        """Snapshot the weights (after every request submitted before), save them, return a pinned sampler.

        Under LoRA the snapshot is an extra adapter on the shared base model,
        and the folder ``<log_dir>/sampler_weights/<name>`` is in peft's layout.

        Raises:
            ValueError: if ``name`` is not a plain file name.
            RuntimeError: if the backend is not entered.
        """
        check_name(name)
        path = self._runtime.log_dir / "sampler_weights" / name

        def save() -> HFSamplingClient:
            engine = self._engine()
            save_hf_checkpoint(path, self._policy, self._settings.source, None, "sampler")
            return HFSamplingClient(engine, str(path))

        return await self._jobs.call(save)

    async def create_sampling_client(self) -> HFSamplingClient:
        """A pinned sampler over the current weights, without writing anything to disk."""
        return await self._jobs.call(lambda: HFSamplingClient(self._engine(), None))

    async def save_state(self, name: str) -> str:
        """Save the weights and Adam's state to ``<log_dir>/checkpoints/<name>``.

        Returns:
            The folder, for :meth:`load_state` or ``HFBackend.create_training_client_from_state``.

        Raises:
            ValueError: if ``name`` is not a plain file name.
            RuntimeError: if the backend is not entered.
        """
        check_name(name)
        path = self._runtime.log_dir / "checkpoints" / name

        def save() -> str:
            save_hf_checkpoint(path, self._policy, self._settings.source, self._adam, "state")
            return str(path)

        return await self._jobs.call(save)

    async def load_state(self, path: str, *, with_optimizer: bool = True) -> None:
        """Replace the weights (and, if asked, Adam's state) with a saved state.

        Raises:
            FileNotFoundError: if ``path`` is not a checkpoint.
            ValueError: if it was saved with another LoRA rank, or has no
                optimizer state and one was asked for.
            RuntimeError: if the backend is not entered.
        """

        def load() -> None:
            ckpt = load_hf_checkpoint(Path(path), with_optimizer=with_optimizer)
            if ckpt.lora_rank != self._policy.lora_rank:
                raise ValueError(f"{path} has lora_rank {ckpt.lora_rank}, this client {self._policy.lora_rank}")
            self._policy.activate()
            self._policy.load_trained_state(ckpt.weights)
            self._adam = _adam_on(ckpt.adam, self._policy.device) if ckpt.adam is not None else AdamState()

        await self._jobs.call(load)

    async def get_tokenizer(self) -> Any:
        """The model's Hugging Face tokenizer (chat template included)."""
        return self._tokenizer


def _adam_on(adam: AdamState, device: torch.device) -> AdamState:
    """``adam`` with its moments moved to ``device``."""
    return AdamState(
        step=adam.step,
        exp_avg={k: v.to(device) for k, v in adam.exp_avg.items()},
        exp_avg_sq={k: v.to(device) for k, v in adam.exp_avg_sq.items()},
    )
