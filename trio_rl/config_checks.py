"""The checks behind ``Config.validate``: each names the field at fault and the fix, in one ``ConfigError``."""

from __future__ import annotations

from typing import TYPE_CHECKING, get_args

from tinker import types as tinker_types

from . import _tinker_compat as compat
from .asyncio_bridge import BRIDGE_MODES
from .backends.protocol import check_inflight_before_work, check_loss_before_work
from .errors import ConfigError

if TYPE_CHECKING:
    from .config import AsyncConfig, Config, StreamMinibatchConfig

LOSS_FNS: tuple[str, ...] = tuple(name for name in get_args(tinker_types.LossFnType) if name != "custom")
"""Every loss the installed tinker SDK's ``LossFnType`` admits, except ``custom`` (a client-side
loss, which needs ``forward_backward_custom``); whether a backend trains it is its own check."""

DEFAULT_LOSS_FN = "importance_sampling"
"""``Config.loss_fn``'s default: in async mode it never conflicts with ``AsyncConfig.loss_fn``."""


def validate_config(config: Config, dataset_batch_size: int | None) -> None:
    """Reject an invalid configuration, naming the field and the fix (the body of ``Config.validate``).

    Raises:
        ConfigError: for the first problem found.
    """
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


def _check_losses(config: Config) -> None:
    """The cookbook 0.6.1's loss checks: a known loss, no conflict with AsyncConfig's, what stable_reinforce needs."""
    _check_known_loss("loss_fn", config.loss_fn)
    if config.async_config is not None and config.async_config.loss_fn is not None:
        _check_known_loss("async_config.loss_fn", config.async_config.loss_fn)
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


def _check_known_loss(field: str, loss: str) -> None:
    if loss in LOSS_FNS:
        return
    if loss == "stable_reinforce":
        raise ConfigError(
            field,
            f"'stable_reinforce' needs the tinker SDK 0.38 or later; the installed {compat.SDK_VERSION} lacks it "
            "(upgrade tinker, or choose another loss)",
        )
    raise ConfigError(field, f"unknown loss {loss!r}; use one of {', '.join(LOSS_FNS)}")


def _check_numbers(config: Config) -> None:
    _positive("learning_rate", config.learning_rate, "a positive float such as 1e-4")
    _positive("max_tokens", config.max_tokens, "a positive token count")
    _non_negative("temperature", config.temperature, "0 samples greedily")
    _in_range("top_p", config.top_p, 0.0, 1.0, "(0, 1]; 1 disables nucleus sampling", low_open=True)
    if not (config.top_k == -1 or config.top_k >= 1):
        raise ConfigError("top_k", f"must be -1 (disabled) or >= 1, got {config.top_k}")
    _positive("lora_rank", config.lora_rank, "a positive rank such as 32")
    _in_range("adam_beta1", config.adam_beta1, 0.0, 1.0, "[0, 1), such as 0.9", high_open=True)
    _in_range("adam_beta2", config.adam_beta2, 0.0, 1.0, "[0, 1), such as 0.95", high_open=True)
    _positive("adam_eps", config.adam_eps, "a small positive float such as 1e-8")
    _non_negative("weight_decay", config.weight_decay, "0 disables it")
    _non_negative("grad_clip_norm", config.grad_clip_norm, "0 disables clipping")
    _positive("cancel_save_timeout", config.cancel_save_timeout, "seconds, such as 60")
    _positive("num_substeps", config.num_substeps, "1 or more")
    _positive("eval_timeout", config.eval_timeout, "seconds, such as 1800")
    _non_negative("eval_every", config.eval_every, "0 disables periodic evaluation")
    _non_negative("save_every", config.save_every, "0 saves only the final state")
    if config.max_steps is not None:
        _non_negative("max_steps", config.max_steps, "None trains until the data runs out")
    if config.num_workers is not None:
        _positive("num_workers", config.num_workers, "at least 1, or None for the default")


def _check_kl_penalty(config: Config) -> None:
    _non_negative("kl_penalty_coef", config.kl_penalty_coef, "0 disables the KL penalty")
    _non_negative("kl_discount_factor", config.kl_discount_factor, "0 disables discounting")
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
        _divides("dataset batch size", dataset_batch_size, "num_substeps", config.num_substeps)


def check_stream_config(stream: StreamMinibatchConfig, num_substeps: int, dataset_batch_size: int | None) -> None:
    """Reject stream sizes that cannot split evenly, or that differ from the dataset's batches."""
    _positive("stream_minibatch_config.groups_per_batch", stream.groups_per_batch, "at least 1")
    _positive("stream_minibatch_config.num_minibatches", stream.num_minibatches, "at least 1")
    _divides(
        "stream_minibatch_config.groups_per_batch",
        stream.groups_per_batch,
        "stream_minibatch_config.num_minibatches",
        stream.num_minibatches,
    )
    _divides("stream_minibatch_config.num_minibatches", stream.num_minibatches, "num_substeps", num_substeps)
    if dataset_batch_size is not None and dataset_batch_size != stream.groups_per_batch:
        raise ConfigError(
            "stream_minibatch_config.groups_per_batch",
            f"is {stream.groups_per_batch} but the dataset's batches hold {dataset_batch_size} groups; make them equal",
        )


def check_async_config(config: AsyncConfig, num_substeps: int) -> None:
    """Reject a negative K, an empty step, an unknown policy, or steps that substeps cannot split."""
    if config.max_steps_off_policy < 0:
        raise ConfigError("async_config.max_steps_off_policy", f"K must be >= 0, got {config.max_steps_off_policy}")
    _positive("async_config.groups_per_batch", config.groups_per_batch, "at least 1 group per step")
    if config.staleness not in ("oldest_first", "pace", "requeue"):
        raise ConfigError(
            "async_config.staleness", f"use 'oldest_first', 'pace' or 'requeue', not {config.staleness!r}"
        )
    _divides("async_config.groups_per_batch", config.groups_per_batch, "num_substeps", num_substeps)
    if config.inflight_weights and config.staleness != "oldest_first":
        raise ConfigError(
            "async_config.inflight_weights",
            f"in-flight weights need staleness='oldest_first', not {config.staleness!r}: a rollout's tokens "
            "come from ever newer weights, so neither a step fixed at hand-out nor resampling stale groups applies",
        )
    if config.inflight_weights and num_substeps != 1:
        raise ConfigError(
            "async_config.inflight_weights",
            f"in-flight weights need num_substeps=1, not {num_substeps}: a backend tells each token's weights "
            "version in optimizer steps, which count training steps only when a step takes one",
        )


def _positive(name: str, value: float, fix: str) -> None:
    if not value > 0:  # also rejects NaN
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
