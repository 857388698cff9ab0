"""Run configuration: the knobs of tinker-cookbook's RL loop, checked before any work starts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast, get_args

from tinker import types as tinker_types

from .asyncio_bridge import BRIDGE_MODES, BridgeMode
from .errors import ConfigError
from .loop.schedules import Pace, Requeue, Schedule, Stream, Sync
from .rl.kl import KLReferenceConfig
from .rl.rollouts import ErrorStrategy, FailFast, MinViableGroup, RetryOnFailure, rollout_strategy_from_config

LOSS_FNS: tuple[str, ...] = tuple(name for name in get_args(tinker_types.LossFnType) if name != "custom")
"""Every loss the installed tinker SDK's ``LossFnType`` admits, except ``custom`` (a client-side
loss, which needs ``forward_backward_custom``); whether a backend trains it is its own check."""


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
        """Reject sizes that cannot split evenly, or that differ from the dataset's batches."""
        _positive("stream_minibatch_config.groups_per_batch", self.groups_per_batch, "at least 1")
        _positive("stream_minibatch_config.num_minibatches", self.num_minibatches, "at least 1")
        _divides(
            "stream_minibatch_config.groups_per_batch",
            self.groups_per_batch,
            "stream_minibatch_config.num_minibatches",
            self.num_minibatches,
        )
        _divides("stream_minibatch_config.num_minibatches", self.num_minibatches, "num_substeps", num_substeps)
        if dataset_batch_size is not None and dataset_batch_size != self.groups_per_batch:
            raise ConfigError(
                "stream_minibatch_config.groups_per_batch",
                f"is {self.groups_per_batch} but the dataset's batches hold {dataset_batch_size} groups; make them equal",
            )


@dataclass(frozen=True)
class AsyncConfig:
    """Off-policy training: rollouts keep sampling while the trainer trains.

    Attributes:
        max_steps_off_policy: K, how many steps behind the trainer a group's
            sampling weights may be when it is trained.
        groups_per_batch: groups per training step.
        staleness: ``"pace"`` (the default, tinker-cookbook 0.6.1's behaviour)
            never starts a group that could end up more than K steps stale, so
            no completed group is discarded; ``"requeue"`` (the cookbook 0.5.5
            behaviour) resamples groups more than K steps stale while the
            dataset still has data and drops them (counted) afterwards.
    """

    max_steps_off_policy: int
    groups_per_batch: int
    staleness: Literal["pace", "requeue"] = "pace"

    def validate(self, num_substeps: int) -> None:
        """Reject a negative K, an empty step, an unknown policy, or steps that substeps cannot split."""
        if self.max_steps_off_policy < 0:
            raise ConfigError("async_config.max_steps_off_policy", f"K must be >= 0, got {self.max_steps_off_policy}")
        _positive("async_config.groups_per_batch", self.groups_per_batch, "at least 1 group per step")
        if self.staleness not in ("requeue", "pace"):
            raise ConfigError("async_config.staleness", f"use 'requeue' or 'pace', not {self.staleness!r}")
        _divides("async_config.groups_per_batch", self.groups_per_batch, "num_substeps", num_substeps)


@dataclass(frozen=True)
class Config:
    """Everything a run needs besides its dataset, backend and evaluators.

    Attributes:
        log_path: folder for ``metrics.jsonl``, ``checkpoints.jsonl`` and checkpoints.
        base_model: model name passed to the backend.
        lora_rank: LoRA rank on Tinker; ignored by backends that train all weights.
        learning_rate, adam_beta1, adam_beta2, adam_eps, weight_decay, grad_clip_norm:
            Adam parameters for every ``optim_step``.
        max_tokens, temperature, top_k, top_p: sampling parameters for rollouts.
        loss_fn, loss_fn_config: the loss sent with ``forward_backward``.
        num_substeps: optimizer steps per training step (the batch is split evenly).
        eval_every: evaluate the weights of every ``eval_every``-th step (0: only the final weights).
        save_every: save state every ``save_every`` steps (0: only the final state).
        max_steps: stop once this many training steps are done, counting those before a
            resume (None: when the data runs out).
        remove_constant_reward_groups: drop groups whose rewards are all equal.
        kl_penalty_coef: the KL penalty against ``kl_reference_config``'s model, added to the
            advantages as tinker-cookbook does (0: none).
        kl_discount_factor: with a KL penalty, sum each token's penalty over the future
            with this discount (0: no discounting).
        kl_reference_config: the reference model; required when ``kl_penalty_coef > 0``.
        seed: seed from which every rollout's randomness derives.
        num_workers: concurrent rollout workers (None: enough for every group in flight).
        rollout_error_tolerance: what a failed rollout does to its group, as in
            tinker-cookbook: ``False`` (:class:`~trio_rl.FailFast`: the run ends),
            ``True`` (:class:`~trio_rl.RetryOnFailure` with its defaults), or a
            strategy. Under a retrying strategy a group that fails beyond its
            tolerance is skipped and counted (``rollout_errors/...``).
        stream_minibatch_config, async_config: select the mode (neither: sync on-policy).
        load_checkpoint_path: resume from this ``save_state`` path (see also ``resume``).
        resume: resume from the newest checkpoint recorded in ``log_path`` that loads, if
            there is one; without it (or ``overwrite``), a ``log_path`` that already
            holds a run is refused before any work.
        overwrite: replace the run that ``log_path`` holds (its metrics, checkpoint log
            and config; a backend's own files there are left alone).
        save_on_cancel: when the run is cancelled (Ctrl-C in the examples), save the
            state of the last completed step, waiting at most ``cancel_save_timeout`` s.
            A step that had already submitted work when the cancel came is completed
            first (its requests cannot be taken back), so the state and its record agree.
        eval_timeout: seconds one evaluator may take on one set of weights; a slower
            one ends the run with :class:`~trio_rl.errors.EvaluationTimeoutError`.
        asyncio_bridge: how coroutines of envs, builders and evaluators are run
            (see :mod:`trio_rl.asyncio_bridge`): ``"auto"`` decides per call from
            the defining module's imports (asyncio, aiohttp, tinker_cookbook) or a ``runs_on`` mark, ``"always"`` runs every one
            on the run's asyncio loop (tinker-cookbook code), ``"never"`` runs
            them as plain Trio coroutines and opens no loop (the fastest).
    """

    log_path: Path | str
    base_model: str = "trio-rl-tiny"
    lora_rank: int = 32
    learning_rate: float = 1e-4
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0
    max_tokens: int = 32
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    loss_fn: str = "importance_sampling"
    loss_fn_config: dict[str, float] | None = None
    num_substeps: int = 1
    eval_every: int = 20
    save_every: int = 20
    max_steps: int | None = None
    remove_constant_reward_groups: bool = False
    kl_penalty_coef: float = 0.0
    kl_discount_factor: float = 0.0
    kl_reference_config: KLReferenceConfig | None = None
    seed: int = 0
    num_workers: int | None = None
    rollout_error_tolerance: bool | ErrorStrategy = False
    stream_minibatch_config: StreamMinibatchConfig | None = None
    async_config: AsyncConfig | None = None
    load_checkpoint_path: str | None = None
    resume: bool = False
    overwrite: bool = False
    save_on_cancel: bool = False
    cancel_save_timeout: float = 60.0
    eval_timeout: float = 1800.0
    asyncio_bridge: BridgeMode = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "log_path", Path(self.log_path))

    @property
    def mode(self) -> Literal["sync", "stream", "async"]:
        """Which training loop the configuration selects."""
        if self.async_config is not None:
            return "async"
        if self.stream_minibatch_config is not None:
            return "stream"
        return "sync"

    def schedule(self, dataset_batch_size: int) -> Schedule:
        """The schedule of the mode this configuration selects.

        Args:
            dataset_batch_size: groups in the dataset's first batch; sync and stream
                steps follow each batch's own size, this only names the usual one.
        """
        if self.async_config is not None:
            ac = self.async_config
            policy = Pace if ac.staleness == "pace" else Requeue
            return policy(ac.groups_per_batch, self.num_substeps, ac.max_steps_off_policy)
        if self.stream_minibatch_config is not None:
            sc = self.stream_minibatch_config
            return Stream(sc.groups_per_batch, sc.num_minibatches, self.num_substeps)
        return Sync(max(1, dataset_batch_size), self.num_substeps)

    def rollout_strategy(self) -> ErrorStrategy:
        """The error strategy ``rollout_error_tolerance`` selects (the cookbook's ``effective_rollout_strategy``)."""
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

    def __hash__(self) -> int:
        # The generated hash would fail on ``loss_fn_config`` (a dict); hash its items instead.
        return hash(tuple(_hashable(getattr(self, f.name)) for f in dataclasses.fields(self)))

    def to_json(self) -> dict[str, Any]:
        """A JSON-able view, written beside the metrics as ``config.json``; :meth:`from_json` reads it back."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = {"type": type(value).__name__, **dataclasses.asdict(value)}
            elif isinstance(value, Path):
                value = str(value)
            out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Config:
        """The configuration :meth:`to_json` wrote: nested parts become their dataclasses again.

        Raises:
            ConfigError: for an unknown field or a nested part of unknown type.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(unknown[0], f"is not a Config field (known: {', '.join(sorted(names))})")
        values = {key: _from_json_value(key, value) for key, value in data.items()}
        return cls(**values)

    def validate(self, dataset_batch_size: int | None = None) -> None:
        """Reject an invalid configuration, naming the field and the fix.

        Args:
            dataset_batch_size: groups in the dataset's first batch, when known; the
                stream-minibatch mode needs it to match ``groups_per_batch``.

        Raises:
            ConfigError: for the first problem found.
        """
        if self.loss_fn not in LOSS_FNS:
            raise ConfigError("loss_fn", f"unknown loss {self.loss_fn!r}; use one of {', '.join(LOSS_FNS)}")
        _positive("learning_rate", self.learning_rate, "a positive float such as 1e-4")
        _positive("max_tokens", self.max_tokens, "a positive token count")
        _non_negative("temperature", self.temperature, "0 samples greedily")
        _in_range("top_p", self.top_p, 0.0, 1.0, "(0, 1]; 1 disables nucleus sampling", low_open=True)
        if not (self.top_k == -1 or self.top_k >= 1):
            raise ConfigError("top_k", f"must be -1 (disabled) or >= 1, got {self.top_k}")
        _positive("lora_rank", self.lora_rank, "a positive rank such as 32")
        _in_range("adam_beta1", self.adam_beta1, 0.0, 1.0, "[0, 1), such as 0.9", high_open=True)
        _in_range("adam_beta2", self.adam_beta2, 0.0, 1.0, "[0, 1), such as 0.95", high_open=True)
        _positive("adam_eps", self.adam_eps, "a small positive float such as 1e-8")
        _non_negative("weight_decay", self.weight_decay, "0 disables it")
        _non_negative("grad_clip_norm", self.grad_clip_norm, "0 disables clipping")
        _positive("cancel_save_timeout", self.cancel_save_timeout, "seconds, such as 60")
        _positive("num_substeps", self.num_substeps, "1 or more")
        _positive("eval_timeout", self.eval_timeout, "seconds, such as 1800")
        _non_negative("eval_every", self.eval_every, "0 disables periodic evaluation")
        _non_negative("save_every", self.save_every, "0 saves only the final state")
        if self.max_steps is not None:
            _non_negative("max_steps", self.max_steps, "None trains until the data runs out")
        if self.num_workers is not None:
            _positive("num_workers", self.num_workers, "at least 1, or None for the default")
        _check_kl_penalty(self)
        try:
            self.rollout_strategy()
        except TypeError as error:
            raise ConfigError("rollout_error_tolerance", str(error)) from None
        if self.async_config is not None and self.stream_minibatch_config is not None:
            raise ConfigError(
                "async_config", "async_config and stream_minibatch_config are exclusive; set one of them to None"
            )
        if self.async_config is not None:
            self.async_config.validate(self.num_substeps)
        if self.stream_minibatch_config is not None:
            self.stream_minibatch_config.validate(self.num_substeps, dataset_batch_size)
        if self.async_config is None and self.stream_minibatch_config is None and dataset_batch_size is not None:
            _divides("dataset batch size", dataset_batch_size, "num_substeps", self.num_substeps)
        if self.asyncio_bridge not in BRIDGE_MODES:
            raise ConfigError(
                "asyncio_bridge", f"use one of {', '.join(map(repr, BRIDGE_MODES))}, not {self.asyncio_bridge!r}"
            )
        if self.load_checkpoint_path is not None and self.resume:
            raise ConfigError("resume", "give either load_checkpoint_path or resume=True, not both")
        if self.overwrite and self.resume:
            raise ConfigError("overwrite", "give either resume=True or overwrite=True, not both")


_JSON_TYPES: dict[str, type[Any]] = {
    t.__name__: t
    for t in (AsyncConfig, StreamMinibatchConfig, FailFast, RetryOnFailure, MinViableGroup, KLReferenceConfig)
}
"""The nested dataclasses :meth:`Config.to_json` may write, by the ``type`` it records."""


def _from_json_value(name: str, value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    fields = dict(cast(dict[str, Any], value))
    if "type" in fields:
        type_name = str(fields.pop("type"))
        if type_name not in _JSON_TYPES:
            raise ConfigError(name, f"unknown type {type_name!r}; expected one of {', '.join(_JSON_TYPES)}")
        return _JSON_TYPES[type_name](**fields)
    return fields


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted(cast(dict[str, Any], value).items()))
    return value


def _check_kl_penalty(config: Config) -> None:
    _non_negative("kl_penalty_coef", config.kl_penalty_coef, "0 disables the KL penalty")
    _non_negative("kl_discount_factor", config.kl_discount_factor, "0 disables discounting")
    if config.kl_penalty_coef > 0 and config.kl_reference_config is None:
        raise ConfigError(
            "kl_reference_config",
            "must be given when kl_penalty_coef > 0, e.g. KLReferenceConfig(base_model=config.base_model)",
        )
    if config.kl_penalty_coef > 0 and config.loss_fn == "cross_entropy":
        raise ConfigError("kl_penalty_coef", "cross_entropy has no advantages to penalise; set it to 0")


def _positive(name: str, value: float, fix: str) -> None:
    if not value > 0:
        raise ConfigError(name, f"must be > 0, got {value}; use {fix}")


def _non_negative(name: str, value: float, fix: str) -> None:
    if not value >= 0:  # also rejects NaN
        raise ConfigError(name, f"must be >= 0, got {value} ({fix})")


def _in_range(
    name: str, value: float, low: float, high: float, fix: str, *, low_open: bool = False, high_open: bool = False
) -> None:
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (above and below):  # also rejects NaN
        raise ConfigError(name, f"must be in {fix}, got {value}")


def _divides(name: str, value: int, divisor_name: str, divisor: int) -> None:
    if value % divisor != 0:
        raise ConfigError(
            name, f"{value} is not divisible by {divisor_name}={divisor}; make it a multiple of {divisor}"
        )
