"""The run's configuration: the knobs of tinker-cookbook's RL loop, and the checks they pass before any work."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tinker import types as tinker_types

from ..asyncio_bridge import BRIDGE_MODES, BridgeMode
from ..backends.protocol import check_inflight_before_work, check_loss_before_work
from ..errors import ConfigError
from ..rl.kl import KLReferenceConfig
from ..rl.rollouts import (
    ErrorStrategy,
    FailFast,
    MinViableGroup,
    RetryOnFailure,
    default_rollout_strategy_for_model,
    rollout_strategy_from_config,
)
from ..rl.termination import TerminationRewardPolicy
from . import as_json
from .checks import DEFAULT_LOSS_FN, check_known_loss, divides, in_range, non_negative, positive
from .modes import AsyncConfig, StreamMinibatchConfig


@dataclass(frozen=True)
class Config:
    """Everything a run needs besides its dataset, backend and evaluators.

    A field's docstring is also the help of its flag on the command line (:mod:`trio_rl.cli.config_flags`).
    """

    log_path: Path | str
    """run folder: metrics.jsonl, config.json, checkpoints.jsonl and the saved states"""
    base_model: str = "trio-rl-tiny"
    """the model to train: a Tinker base model (LoRA), an HF folder or .gguf file; LocalBackend: a label"""
    lora_rank: int = 32
    """LoRA rank (Tinker, HFBackend); backends that train every weight ignore it"""
    learning_rate: float = 1e-4
    """Adam learning rate"""
    adam_beta1: float = 0.9
    """Adam's first-moment decay"""
    adam_beta2: float = 0.95
    """Adam's second-moment decay"""
    adam_eps: float = 1e-8
    """Adam's epsilon"""
    weight_decay: float = 0.0
    """Adam's decoupled weight decay"""
    grad_clip_norm: float = 0.0
    """clip the gradient to this global norm (0: no clipping)"""
    max_tokens: int = 32
    """most tokens per sampled action"""
    temperature: float = 1.0
    """sampling temperature of rollouts (0: greedy)"""
    top_k: int = -1
    """sample from the k most likely tokens only (-1: all)"""
    top_p: float = 1.0
    """nucleus sampling: the smallest set of tokens with this much probability (1: all)"""
    loss_fn: str = "importance_sampling"
    """the loss sent with forward_backward in sync and stream modes (async runs train AsyncConfig.loss_fn)"""
    loss_fn_config: dict[str, float] | None = field(default=None, hash=False)
    """loss parameters as name and value, e.g. clip_low_threshold 0.8 (None: the loss's defaults)"""
    num_substeps: int = 1
    """optimizer steps per training step (the batch is split evenly)"""
    eval_every: int = 20
    """evaluate the weights of every N-th step (0: only the final weights)"""
    save_every: int = 20
    """save a resumable checkpoint every N steps (0: only the final state)"""
    max_steps: int | None = None
    """stop after this many training steps, counting those before a resume (None: when the data runs out)"""
    remove_constant_reward_groups: bool = False
    """filter out groups whose rewards are all equal (they carry no advantage)"""
    num_epochs: int = 1
    """passes over the dataset (tinker-cookbook 0.6.1's): step i trains batch i % len(dataset); steps,
    checkpoints and resume count across epochs, and max_steps caps the total"""
    compute_post_kl: bool = False
    """after each step, score its data under the new weights and log kl_pre_post_v1/v2 (0.6.1's metrics)"""
    termination: TerminationRewardPolicy | None = None
    """how a reward depends on the stop reason (0.6.1's TerminationRewardPolicy: grade, then clamp the
    total of a limit-stopped trajectory to at most 0); None: rewards untouched"""
    rolling_save_every: int = 0
    """also save a resumable checkpoint every N steps not saved by save_every, reason "rolling" (0: none)"""
    kl_penalty_coef: float = 0.0
    """KL penalty against the reference model, added to the advantages as tinker-cookbook does (0: none)"""
    kl_discount_factor: float = 0.0
    """with a KL penalty: sum each token's penalty over the future with this discount (0: none)"""
    kl_reference_config: KLReferenceConfig | None = None
    """the KL penalty's reference model; required when kl_penalty_coef > 0"""
    seed: int = 0
    """seed of every rollout's randomness (the examples seed their data and initial weights with it too)"""
    num_workers: int | None = None
    """concurrent rollout workers (None: enough for every group in flight)"""
    rollout_error_tolerance: bool | ErrorStrategy | None = None
    """what a failed rollout does, as in tinker-cookbook 0.6.1: None (per base_model: MinViableGroup for
    thinkingmachines/Inkling models, else FailFast), False (:class:`~trio_rl.FailFast`: the run ends), True
    (:class:`~trio_rl.RetryOnFailure`) or a strategy; a group beyond its tolerance is skipped and counted"""
    stream_minibatch_config: StreamMinibatchConfig | None = None
    """selects the stream mode: on-policy, each minibatch trained as soon as it fills"""
    async_config: AsyncConfig | None = None
    """selects the async mode: off-policy, rollouts sample while the trainer trains (neither: sync)"""
    load_checkpoint_path: str | None = None
    """start from the weights of this saved state, without its optimizer state"""
    resume: bool = False
    """continue from the newest checkpoint in log_path that loads; without this (or overwrite) a log_path
    that already holds a run is refused before any work"""
    overwrite: bool = False
    """replace the run in log_path (its metrics, checkpoint log and config; a backend's own files stay)"""
    save_on_cancel: bool = False
    """when the run is cancelled (Ctrl-C), save the state of the last completed step; a step that had
    already submitted work is completed first, so the state and its record agree"""
    cancel_save_timeout: float = 60.0
    """seconds the save on cancel may take"""
    eval_timeout: float = 1800.0
    """seconds one evaluator may take on one set of weights; a slower one ends the run"""
    asyncio_bridge: BridgeMode = "auto"
    """how coroutines of envs, builders and evaluators run (:mod:`trio_rl.asyncio_bridge`): auto decides per
    call, always runs each on an asyncio loop inside the run (tinker-cookbook code), never runs them on Trio"""
    transcripts_every: int = 0
    """every N steps, write transcripts of transcript_groups of the step's groups into iteration_NNNNNN/ (an HTML
    page and a rollouts JSONL: every turn, rewards, advantages, env logs, the Datums trained); 0 writes none"""
    transcript_groups: int = 4
    """groups per transcript (tinker-cookbook's num_groups_to_log); 0 writes none"""
    trace: bool = False
    """write a Chrome/Perfetto trace-event JSON of the run (trace_from_step_NNNNNN.json; open it at
    ui.perfetto.dev) and per-scope time/* metrics"""
    timeline_every: int = 0
    """every N steps, write the step's self-contained HTML timeline (iteration_NNNNNN/timing_gantt.html); 0 writes none"""
    stall_warning_s: float | None = 120.0
    """when no step has finished for this many seconds, log a stall report (the groups outstanding and what each
    waits on, what the trainer and dataloader wait on, the Trio task tree), again at that interval; None: never"""

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_path", Path(self.log_path))

    @property
    def mode(self) -> Literal["sync", "stream", "async"]:
        """Which training loop the configuration selects."""
        return "async" if self.async_config else "stream" if self.stream_minibatch_config else "sync"

    def training_loss_fn(self) -> str:
        """The loss this run trains with: ``async_config.loss_fn`` in async mode, ``loss_fn`` otherwise.

        The cookbook 0.6.1's ``Config.training_loss_fn()``; everything that reads the loss reads this.

        Raises:
            ValueError: in async mode with ``AsyncConfig.loss_fn=None``, which only
                a backend resolves (:func:`trio_rl.async_loss.with_async_loss`).
        """
        if self.async_config is None:
            return self.loss_fn
        if self.async_config.loss_fn is None:
            raise ValueError(
                "AsyncConfig.loss_fn=None is resolved per backend when the run starts; "
                "use trio_rl.async_loss.with_async_loss(config, backend) to see it"
            )
        return self.async_config.loss_fn

    def rollout_strategy(self) -> ErrorStrategy:
        """The error strategy ``rollout_error_tolerance`` selects (the cookbook's ``effective_rollout_strategy``).

        Raises:
            TypeError: the tolerance is neither None, a bool nor an error strategy.
        """
        if self.rollout_error_tolerance is None:
            return default_rollout_strategy_for_model(self.base_model)
        return rollout_strategy_from_config(self.rollout_error_tolerance)

    def adam_params(self) -> tinker_types.AdamParams:
        """The ``AdamParams`` sent with every ``optim_step``."""
        return tinker_types.AdamParams(
            learning_rate=self.learning_rate,
            beta1=self.adam_beta1,
            beta2=self.adam_beta2,
            eps=self.adam_eps,
            weight_decay=self.weight_decay,
            grad_clip_norm=self.grad_clip_norm,
        )

    def sampling_params(self) -> tinker_types.SamplingParams:
        """Sampling parameters for rollouts; each turn adds its own seed and stop condition."""
        return tinker_types.SamplingParams(
            max_tokens=self.max_tokens, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p
        )

    def to_json(self) -> dict[str, Any]:
        """A JSON-able view, written beside the metrics as ``config.json``; :meth:`from_json` reads it back."""
        return as_json.to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Config:
        """The configuration :meth:`to_json` wrote: nested parts become their dataclasses again.

        Raises:
            ConfigError: for an unknown field or a nested part of unknown type.
        """
        return cls(**as_json.fields_from_json(cls, data, _NESTED_TYPES))

    def validate(self, dataset_batch_size: int | None = None) -> None:
        """Reject an invalid configuration, naming the field and the fix.

        Args:
            dataset_batch_size: groups in the dataset's first batch, when known; the
                stream-minibatch mode needs it to match ``groups_per_batch``.

        Raises:
            ConfigError: for the first problem found.
        """
        _validate(self, dataset_batch_size)


_NESTED_TYPES = (
    AsyncConfig,
    StreamMinibatchConfig,
    FailFast,
    RetryOnFailure,
    MinViableGroup,
    KLReferenceConfig,
    TerminationRewardPolicy,
)
"""The nested dataclasses :meth:`Config.to_json` may write."""


def check_inflight_on_backend(config: Config, backend: object) -> None:
    """Fail before any work if the run asks for in-flight weights and ``backend`` has none.

    Raises:
        ConfigError: naming ``async_config.inflight_weights`` and the backend's reason.
    """
    if config.async_config is None or not config.async_config.inflight_weights:
        return
    try:
        check_inflight_before_work(backend)
    except ValueError as error:
        raise ConfigError("async_config.inflight_weights", str(error)) from None


def check_loss_on_backend(config: Config, backend: object) -> None:
    """Ask ``backend`` before any work whether it trains the run's loss (``Config.training_loss_fn()``).

    Raises:
        ConfigError: naming the field that chose the loss, the losses the backend trains, and the fix.
    """
    loss = config.training_loss_fn()
    try:
        check_loss_before_work(backend, loss, config.loss_fn_config)
    except ValueError as error:
        if config.async_config is None:
            raise ConfigError("loss_fn", str(error)) from None
        raise ConfigError(
            "async_config.loss_fn",
            f"{error}. Async runs train AsyncConfig.loss_fn, not Config.loss_fn; choose one this backend "
            "trains, e.g. AsyncConfig(..., loss_fn='importance_sampling'), or leave it at None for the "
            "backend's own default (on the examples' command line: --loss-fn)",
        ) from None


def _validate(config: Config, dataset_batch_size: int | None) -> None:
    _check_losses(config)
    _check_numbers(config)
    _check_kl_penalty(config)
    try:
        config.rollout_strategy()
    except TypeError as error:
        raise ConfigError("rollout_error_tolerance", str(error)) from None
    _check_mode(config, dataset_batch_size)
    if config.asyncio_bridge not in BRIDGE_MODES:
        raise ConfigError(
            "asyncio_bridge", f"use one of {', '.join(map(repr, BRIDGE_MODES))}, not {config.asyncio_bridge!r}"
        )
    if config.load_checkpoint_path is not None and config.resume:
        raise ConfigError("resume", "give either load_checkpoint_path or resume=True, not both")
    if config.overwrite and config.resume:
        raise ConfigError("overwrite", "give either resume=True or overwrite=True, not both")


def _check_losses(config: Config) -> None:
    """The cookbook 0.6.1's loss checks: a known loss, no conflict with AsyncConfig's, what stable_reinforce needs."""
    check_known_loss("loss_fn", config.loss_fn)
    if config.async_config is not None and config.async_config.loss_fn is not None:
        check_known_loss("async_config.loss_fn", config.async_config.loss_fn)
        # As in the cookbook: Config.loss_fn's default never conflicts, any other value must agree.
        if config.loss_fn not in (DEFAULT_LOSS_FN, config.async_config.loss_fn):
            raise ConfigError(
                "loss_fn",
                f"Config.loss_fn={config.loss_fn!r} conflicts with AsyncConfig.loss_fn="
                f"{config.async_config.loss_fn!r}; async runs train with AsyncConfig.loss_fn, so set the loss there "
                f"(AsyncConfig(..., loss_fn={config.loss_fn!r}))",
            )
    if _chosen_loss(config) == "stable_reinforce" and config.kl_penalty_coef > 0 and config.kl_discount_factor > 0:
        # Discounting moves the KL penalty onto prompt tokens; stable_reinforce accepts
        # nonzero advantages only on sampled tokens (tinker-cookbook 0.6.1 refuses it too).
        raise ConfigError(
            "kl_discount_factor",
            "kl_discount_factor > 0 is not supported with loss_fn='stable_reinforce' (the AsyncConfig default); "
            "set kl_discount_factor=0 or choose another loss",
        )


def _chosen_loss(config: Config) -> str | None:
    """The run's loss, or ``None`` while ``AsyncConfig.loss_fn=None`` waits for the backend to resolve it."""
    if config.async_config is None:
        return config.loss_fn
    return config.async_config.loss_fn


def _check_numbers(config: Config) -> None:
    positive("learning_rate", config.learning_rate, "a positive float such as 1e-4")
    positive("max_tokens", config.max_tokens, "a positive token count")
    non_negative("temperature", config.temperature, "0 samples greedily")
    in_range("top_p", config.top_p, (0.0, 1.0), "(0, 1]; 1 disables nucleus sampling", low_open=True)
    if not (config.top_k == -1 or config.top_k >= 1):
        raise ConfigError("top_k", f"must be -1 (disabled) or >= 1, got {config.top_k}")
    positive("lora_rank", config.lora_rank, "a positive rank such as 32")
    in_range("adam_beta1", config.adam_beta1, (0.0, 1.0), "[0, 1), such as 0.9", high_open=True)
    in_range("adam_beta2", config.adam_beta2, (0.0, 1.0), "[0, 1), such as 0.95", high_open=True)
    positive("adam_eps", config.adam_eps, "a small positive float such as 1e-8")
    non_negative("weight_decay", config.weight_decay, "0 disables it")
    non_negative("grad_clip_norm", config.grad_clip_norm, "0 disables clipping")
    positive("cancel_save_timeout", config.cancel_save_timeout, "seconds, such as 60")
    positive("num_substeps", config.num_substeps, "1 or more")
    positive("eval_timeout", config.eval_timeout, "seconds, such as 1800")
    non_negative("eval_every", config.eval_every, "0 disables periodic evaluation")
    non_negative("save_every", config.save_every, "0 saves only the final state")
    non_negative("rolling_save_every", config.rolling_save_every, "0 saves no rolling checkpoints")
    if not (isinstance(config.num_epochs, int) and config.num_epochs >= 1):
        raise ConfigError("num_epochs", f"must be an integer >= 1, got {config.num_epochs!r}")
    if config.termination is not None and not isinstance(config.termination, TerminationRewardPolicy):
        raise ConfigError(
            "termination", f"must be a trio_rl TerminationRewardPolicy or None, not {type(config.termination).__name__}"
        )
    if config.max_steps is not None:
        non_negative("max_steps", config.max_steps, "None trains until the data runs out")
    if config.num_workers is not None:
        positive("num_workers", config.num_workers, "at least 1, or None for the default")
    non_negative("transcripts_every", config.transcripts_every, "0 writes no transcripts")
    non_negative("transcript_groups", config.transcript_groups, "0 writes no transcripts")
    non_negative("timeline_every", config.timeline_every, "0 writes no timelines")
    if config.stall_warning_s is not None:
        positive("stall_warning_s", config.stall_warning_s, "seconds, such as 120, or None for no stall report")


def _check_kl_penalty(config: Config) -> None:
    non_negative("kl_penalty_coef", config.kl_penalty_coef, "0 disables the KL penalty")
    non_negative("kl_discount_factor", config.kl_discount_factor, "0 disables discounting")
    if config.kl_penalty_coef > 0 and config.kl_reference_config is None:
        raise ConfigError(
            "kl_reference_config",
            "must be given when kl_penalty_coef > 0, e.g. KLReferenceConfig(base_model=config.base_model)",
        )
    if config.kl_penalty_coef > 0 and _chosen_loss(config) == "cross_entropy":
        raise ConfigError("kl_penalty_coef", "cross_entropy has no advantages to penalise; set it to 0")


def _check_mode(config: Config, dataset_batch_size: int | None) -> None:
    if config.async_config is not None and config.stream_minibatch_config is not None:
        raise ConfigError(
            "async_config", "async_config and stream_minibatch_config are exclusive; set one of them to None"
        )
    if config.async_config is not None:
        config.async_config.validate(config.num_substeps)
    if config.stream_minibatch_config is not None:
        config.stream_minibatch_config.validate(config.num_substeps, dataset_batch_size)
    if config.async_config is None and config.stream_minibatch_config is None and dataset_batch_size is not None:
        divides("dataset batch size", dataset_batch_size, "num_substeps", config.num_substeps)
