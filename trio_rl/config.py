"""Run configuration: the knobs of tinker-cookbook's RL loop, checked before any work starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tinker import types as tinker_types

from . import config_derived, config_json
from .asyncio_bridge import BridgeMode
from .config_checks import LOSS_FNS, check_async_config, check_stream_config, validate_config
from .loop.schedules import Schedule
from .rl.kl import KLReferenceConfig
from .rl.rollouts import ErrorStrategy, FailFast, MinViableGroup, RetryOnFailure

__all__ = ["LOSS_FNS", "AsyncConfig", "Config", "StreamMinibatchConfig"]


@dataclass(frozen=True)
class StreamMinibatchConfig:
    """Sync on-policy training that trains each minibatch as soon as it fills.

    Each step's ``groups_per_batch`` groups are split into ``num_minibatches``
    minibatches; each gets its own ``forward_backward`` as soon as its groups have
    arrived, and an ``optim_step`` follows every ``num_minibatches / num_substeps``
    minibatches.
    """

    groups_per_batch: int
    num_minibatches: int

    def validate(self, num_substeps: int, dataset_batch_size: int | None) -> None:
        """Reject sizes that cannot split evenly, or that differ from the dataset's batches.

        Raises:
            ConfigError: naming the field at fault.
        """
        check_stream_config(self, num_substeps, dataset_batch_size)


@dataclass(frozen=True)
class AsyncConfig:
    """Off-policy training: rollouts keep sampling while the trainer trains.

    Attributes:
        max_steps_off_policy: K, how many steps behind the trainer a group's
            sampling weights may be when it is trained.
        groups_per_batch: groups per training step.
        staleness: ``"oldest_first"`` (the default; tinker-cookbook 0.6.1's
            ``do_async_training``): ``groups_per_batch * (K + 1)`` rollout slots,
            each step trains the ``groups_per_batch`` completed groups sampled
            from the oldest weights, leftovers carry over, a slow group is
            trained when it finishes however stale (K bounds the slots, not the
            staleness) and nothing is discarded; ``"pace"`` (the strict bound
            of tinker-cookbook PR #822, unreleased) fixes each group's step
            when it is handed out and never starts a group that could end up
            more than K steps stale, so a step waits for its stragglers;
            ``"requeue"`` (tinker-cookbook 0.5.5) resamples groups more than K
            steps stale while the dataset still has data and drops them
            (counted) afterwards.
        loss_fn: the loss async runs train with, in place of ``Config.loss_fn``, as in
            tinker-cookbook 0.6.1. ``None`` (the default) resolves per backend before
            any work (:mod:`trio_rl.async_loss`): ``"stable_reinforce"`` on Tinker and
            FakeBackend, as in the cookbook; on LocalBackend and HFBackend, which lack
            it, ``"importance_sampling"`` with token-level truncated importance sampling
            (``loss_fn_config={"tis_cap": 2.0}`` unless ``Config.loss_fn_config`` is set). A ``Config.loss_fn`` other than its default and
            the resolved value is refused.
    """

    max_steps_off_policy: int
    groups_per_batch: int
    staleness: Literal["oldest_first", "pace", "requeue"] = "oldest_first"
    loss_fn: str | None = None
    inflight_weights: bool = False

    def validate(self, num_substeps: int) -> None:
        """Reject a negative K, an empty step, an unknown policy, or steps that substeps cannot split.

        Raises:
            ConfigError: naming the field at fault.
        """
        check_async_config(self, num_substeps)


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
    """drop groups whose rewards are all equal (they carry no advantage)"""
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_path", Path(self.log_path))

    @property
    def mode(self) -> Literal["sync", "stream", "async"]:
        """Which training loop the configuration selects."""
        return "async" if self.async_config else "stream" if self.stream_minibatch_config else "sync"

    def schedule(self, dataset_batch_size: int) -> Schedule:
        """The schedule of the mode this configuration selects.

        Args:
            dataset_batch_size: groups in the dataset's first batch; sync and stream
                steps follow each batch's own size, this only names the usual one.
        """
        return config_derived.schedule_for(self, dataset_batch_size)

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

    def inflight_weights(self) -> bool:
        """Whether this run publishes its weights in flight (``async_config.inflight_weights``)."""
        return self.async_config is not None and self.async_config.inflight_weights

    def rollout_strategy(self) -> ErrorStrategy:
        """The error strategy ``rollout_error_tolerance`` selects (the cookbook's ``effective_rollout_strategy``)."""
        return config_derived.rollout_strategy(self)

    def adam_params(self) -> tinker_types.AdamParams:
        """The ``AdamParams`` sent with every ``optim_step``."""
        return config_derived.adam_params(self)

    def sampling_params(self) -> tinker_types.SamplingParams:
        """Sampling parameters for rollouts; each turn adds its own seed and stop condition."""
        return config_derived.sampling_params(self)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able view, written beside the metrics as ``config.json``; :meth:`from_json` reads it back."""
        return config_json.to_json(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Config:
        """The configuration :meth:`to_json` wrote: nested parts become their dataclasses again.

        Raises:
            ConfigError: for an unknown field or a nested part of unknown type.
        """
        return cls(**config_json.fields_from_json(cls, data, _NESTED_TYPES))

    def validate(self, dataset_batch_size: int | None = None) -> None:
        """Reject an invalid configuration, naming the field and the fix.

        Args:
            dataset_batch_size: groups in the dataset's first batch, when known; the
                stream-minibatch mode needs it to match ``groups_per_batch``.

        Raises:
            ConfigError: for the first problem found.
        """
        validate_config(self, dataset_batch_size)


_NESTED_TYPES = (AsyncConfig, StreamMinibatchConfig, FailFast, RetryOnFailure, MinViableGroup, KLReferenceConfig)
"""The nested dataclasses :meth:`Config.to_json` may write."""
