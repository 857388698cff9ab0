"""``LocalBackend``: the backend protocol on an in-process torch model."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import trio

from trio_rl.backends.local.checkpoint import load_checkpoint
from trio_rl.backends.local.losses import LOSS_FUNCTIONS, check_loss_fn, token_tis_loss
from trio_rl.backends.local.model import ModelConfig, TransformerLM
from trio_rl.backends.local.runtime import BackendRuntime, EngineSettings, InProcessBackend
from trio_rl.backends.local.sampler import LocalSamplingClient, SamplingEngine, frozen_copy
from trio_rl.backends.local.tokenizer import CharTokenizer
from trio_rl.backends.local.training import LocalTrainingClient

DEFAULT_ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?'\"()+-*/=<>\n"
"""The alphabet of the default :class:`CharTokenizer`: printable ASCII letters, digits and punctuation."""


class LocalBackend(InProcessBackend):
    """Trains and samples a small transformer in this process, on the CPU.

    Enter it around everything that uses it::

        async with LocalBackend(log_dir=Path("runs/x")) as backend:
            trainer = await backend.create_training_client(base_model="local", seed=0)
            sampler = await trainer.save_weights_for_sampler("step-0")
            response = await sampler.sample(prompt, 4, params)

    Sampling engines and training workers are tasks in a nursery that lives as
    long as that block; leaving it cancels whatever is still queued.

    Args:
        model_config: sizes of the model; the default is tiny.
        tokenizer: the tokenizer; defaults to a :class:`CharTokenizer` over
            :data:`DEFAULT_ALPHABET`.
        log_dir: folder for checkpoints (``checkpoints/``) and sampler weights
            (``sampler_weights/``).
        seed: seeds the seeds of unseeded training clients and unseeded sampling requests.
        num_threads: torch intra-op threads while the backend is entered
            (``torch.set_num_threads`` is process-wide; the previous value is
            restored on exit). The default, 1, is deliberate: for models this
            small a second thread gains little, and when the cores are shared
            with other busy processes, torch's spinning thread barriers made a
            decode step many times slower with 2 threads than with 1 on a
            2-core machine. ``None`` keeps torch's setting.
        engine: how the sampling engines batch (``max_batch_rows``), cache prompts
            (``prefix_cache_bytes``) and take in-flight weights (``inflight_recompute_kv``);
            see :class:`~trio_rl.backends.EngineSettings`.

    Raises:
        ValueError: for ``num_threads`` below 1.
    """

    def __init__(
        self,
        *,
        log_dir: Path | str,
        model_config: ModelConfig | None = None,
        tokenizer: CharTokenizer | None = None,
        seed: int = 0,
        num_threads: int | None = 1,
        engine: EngineSettings | None = None,
    ) -> None:
        if num_threads is not None and num_threads < 1:
            raise ValueError("num_threads must be at least 1")
        self._model_config = model_config if model_config is not None else ModelConfig()
        self._tokenizer = tokenizer if tokenizer is not None else CharTokenizer(DEFAULT_ALPHABET)
        self._runtime = BackendRuntime(Path(log_dir), seed, engine or EngineSettings())
        self._num_threads = num_threads
        self._base_seeds: dict[str, int] = {}

    @property
    def tokenizer(self) -> CharTokenizer:
        """The tokenizer of fresh training clients."""
        return self._tokenizer

    @property
    def model_config(self) -> ModelConfig:
        """The model sizes of fresh training clients."""
        return self._model_config

    def get_tokenizer(self) -> CharTokenizer:
        """The tokenizer of fresh training clients (same as :attr:`tokenizer`)."""
        return self._tokenizer

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> LocalTrainingClient:
        """Create a freshly initialised model to train.

        Args:
            base_model: a label only; the model is always a new :class:`TransformerLM`
                of this backend's ``model_config``.
            lora_rank: ignored: the local backend fine-tunes every parameter.
            seed: seeds the initial weights; drawn from the backend's seed if ``None``.

        Returns:
            A training client.

        Raises:
            RuntimeError: if the backend is not entered.
        """
        self._runtime.require_entered()
        if seed is None:
            seed = self._runtime.rng.getrandbits(63)
        config, vocab, init_seed = self._model_config, self._tokenizer.vocab_size, seed
        model = await trio.to_thread.run_sync(
            lambda: TransformerLM(config, vocab, seed=init_seed), limiter=self._runtime.limiter
        )
        # "The base model" of this label is the initial weights it was first made with.
        self._base_seeds.setdefault(base_model, seed)
        return LocalTrainingClient(self._runtime, model, self._tokenizer)

    supported_losses: frozenset[str] = frozenset(LOSS_FUNCTIONS)
    """The losses LocalBackend implements (see :mod:`trio_rl.backends.local.losses`)."""

    def check_loss_fn(self, loss_fn: str, loss_fn_config: dict[str, float] | None) -> None:
        """Reject, before any work, a loss this backend does not implement or a config it does not read.

        Raises:
            ValueError: naming the loss and the fix.
        """
        check_loss_fn(loss_fn, loss_fn_config)

    def default_async_loss(self) -> tuple[str, dict[str, float]]:
        """The loss of ``AsyncConfig(loss_fn=None)`` here (:func:`trio_rl.backends.local.losses.token_tis_loss`)."""
        return token_tis_loss()

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> LocalSamplingClient:
        """A sampling client for the initial weights of ``base_model``, or for the weights at ``model_path``.

        A local "base model" is the freshly initialised model that
        :meth:`create_training_client` first made under that label (same seed,
        same weights), so a KL penalty pulls the policy back towards where it started.

        Raises:
            ValueError: no training client was created for ``base_model`` and no ``model_path`` given.
            FileNotFoundError: ``model_path`` is not a checkpoint folder.
        """
        self._runtime.require_entered()
        if model_path is not None:
            build = partial(_saved_sampler, self._runtime, model_path)
        elif base_model in self._base_seeds:
            seed = self._base_seeds[base_model]
            build = partial(_initial_sampler, self._runtime, self._model_config, self._tokenizer, seed)
        else:
            raise ValueError(
                f"LocalBackend has no initial weights for {base_model!r}: create a training client for it "
                "first, or give model_path (a save_state or sampler folder)"
            )
        return await trio.to_thread.run_sync(build, limiter=self._runtime.limiter)

    async def create_training_client_from_state(self, path: str, *, with_optimizer: bool = True) -> LocalTrainingClient:
        """Create a training client from a folder returned by ``save_state``, to resume.

        The model's config and tokenizer come from the checkpoint.

        Args:
            path: the checkpoint folder.
            with_optimizer: also restore Adam's moments and step count.

        Raises:
            RuntimeError: if the backend is not entered.
            FileNotFoundError: if ``path`` is not a checkpoint.
            ValueError: if it holds no optimizer state and one was asked for.
        """
        self._runtime.require_entered()
        load = partial(_saved_trainer, self._runtime, path, with_optimizer)
        return await trio.to_thread.run_sync(load, limiter=self._runtime.limiter)


def _saved_trainer(runtime: BackendRuntime, path: str, with_optimizer: bool) -> LocalTrainingClient:
    ckpt = load_checkpoint(Path(path), with_optimizer=with_optimizer)
    model = TransformerLM(ckpt.model_config, ckpt.tokenizer.vocab_size)
    model.load_state_dict(ckpt.weights)
    return LocalTrainingClient(runtime, model, ckpt.tokenizer, ckpt.adam)


def _saved_sampler(runtime: BackendRuntime, path: str) -> LocalSamplingClient:
    ckpt = load_checkpoint(Path(path), with_optimizer=False)
    model = TransformerLM(ckpt.model_config, ckpt.tokenizer.vocab_size)
    model.load_state_dict(ckpt.weights)
    return LocalSamplingClient(SamplingEngine(frozen_copy(model), ckpt.tokenizer, runtime), path)


def _initial_sampler(
    runtime: BackendRuntime, config: ModelConfig, tokenizer: CharTokenizer, seed: int
) -> LocalSamplingClient:
    model = TransformerLM(config, tokenizer.vocab_size, seed=seed)
    return LocalSamplingClient(SamplingEngine(frozen_copy(model), tokenizer, runtime), None)
