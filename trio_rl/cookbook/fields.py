"""tinker-cookbook 0.6.1's ``rl.train.Config``, field by field, as a trio_rl :class:`~trio_rl.Config`.

Every field of 0.6.1's ``Config``, ``AsyncConfig``, ``StreamMinibatchConfig`` and
``KLReferenceConfig`` (``chz.chz_fields`` lists them) is named in exactly one of
the tables below, so none can be forgotten: it is passed on under the same or a
new name, converted, used by :func:`trio_rl.cookbook.train.main` itself, kept as
a label, or accepted only at values whose meaning trio_rl has and refused at any
other with a one-line :class:`~trio_rl.ConfigError` before any work. What each
means in 0.6.1 was read in its wheel (``rl/train.py``); ``docs/guides/cookbook.md``
gives the table with the test that shows each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tinker_cookbook.rl import rollout_strategy as cookbook_strategy
from tinker_cookbook.rl.rollout_presets import default_rollout_config_for_model

from .. import config as native
from ..errors import ConfigError
from ..loop.checkpoints import CHECKPOINTS_FILE
from ..rl.kl import KLReferenceConfig
from ..rl.rollouts import ErrorStrategy, FailFast, MinViableGroup, RetryOnFailure
from ..rl.termination import TerminationRewardPolicy

SAME_NAME = (
    "learning_rate",
    "max_tokens",
    "eval_every",
    "save_every",
    "kl_penalty_coef",
    "kl_discount_factor",
    "loss_fn",
    "num_substeps",
    "lora_rank",
    "temperature",
    "remove_constant_reward_groups",
    "max_steps",
    "compute_post_kl",
    "num_epochs",
    "rolling_save_every",
)
"""Fields trio_rl's Config has under the same name and with the same meaning."""

RENAMED = {"model_name": "base_model"}
"""Fields trio_rl's Config has under another name."""

CONVERTED = (
    "log_path",
    "load_checkpoint_path",
    "loss_fn_config",
    "kl_reference_config",
    "rollout_error_tolerance",
    "async_config",
    "stream_minibatch_config",
    "termination",
    "num_groups_to_log",
    "enable_trace",
    "span_chart_every",
)
"""Fields whose value becomes a trio_rl value of another type (or decides another field, as log_path does resume)."""

RUN_INPUTS = ("dataset_builder", "evaluator_builders", "base_url")
"""Fields ``main`` uses itself: the dataset and test set, the evaluators, the Tinker backend's URL."""

LABELS = ("recipe_name", "renderer_name", "session_name", "wandb_name")
"""Names 0.6.1 sends to the Tinker service or W&B as metadata; they change nothing trained or written."""


@dataclass(frozen=True)
class Accepted:
    """A field accepted only at some values; any other is refused with ``reason``."""

    values: tuple[Any, ...]
    reason: str


ONLY_AT = {
    "rollout_json_export": Accepted((True, False), "never refused"),
    "wandb_project": Accepted((None,), "trio_rl's W&B sink is a command-line option (--log-to wandb), not a field"),
    "ttl_seconds": Accepted(
        (604800, None), "trio_rl's checkpoints never expire; only the default and None (no expiry) are accepted"
    ),
    "rolling_ttl_seconds": Accepted((7200,), "trio_rl's checkpoints never expire; only the default is accepted"),
}
"""Fields accepted only at the values listed (the defaults are among them: see the field table for what differs)."""

ASYNC_FIELDS = ("max_steps_off_policy", "groups_per_batch", "loss_fn")
"""0.6.1's AsyncConfig: K (``sampling_steps_ahead`` on the cookbook's main branch), the step's groups, the loss."""
STREAM_FIELDS = ("groups_per_batch", "num_minibatches")
KL_REFERENCE_FIELDS = ("base_model", "load_checkpoint_path")


def config_fields() -> tuple[str, ...]:
    """Every 0.6.1 Config field these tables name, each once."""
    return (*SAME_NAME, *RENAMED, *CONVERTED, *RUN_INPUTS, *LABELS, *ONLY_AT)


def check_only_at(config: Any) -> None:
    """Refuse a field whose value trio_rl does not give 0.6.1's meaning.

    Raises:
        ConfigError: naming the field, its value and the reason.
    """
    for name, accepted in ONLY_AT.items():
        value = getattr(config, name)
        if not any(value == v and type(value) is type(v) for v in accepted.values):
            raise ConfigError(name, f"{value!r} is not supported: {accepted.reason}")


def native_config(config: Any, *, resume: bool) -> native.Config:
    """The trio_rl Config that trains what ``config`` (a 0.6.1 ``rl.train.Config``) trains.

    Args:
        config: the cookbook's Config.
        resume: whether ``log_path`` holds checkpoints to continue from (0.6.1 resumes then,
            and a resume wins over ``load_checkpoint_path``).

    Raises:
        ConfigError: for a field trio_rl refuses (see :func:`check_only_at`).
    """
    check_only_at(config)
    fields: dict[str, Any] = {name: getattr(config, name) for name in SAME_NAME}
    fields.update({new: getattr(config, old) for old, new in RENAMED.items()})
    return native.Config(
        **fields,
        log_path=Path(config.log_path),
        resume=resume,
        load_checkpoint_path=None if resume else config.load_checkpoint_path,
        loss_fn_config=None if config.loss_fn_config is None else dict(config.loss_fn_config),
        kl_reference_config=_kl_reference(config.kl_reference_config),
        rollout_error_tolerance=_strategy(config.rollout_error_tolerance),
        async_config=_async(config.async_config),
        stream_minibatch_config=_stream(config.stream_minibatch_config),
        termination=termination_policy(effective_termination(config)),
        # 0.6.1 logs num_groups_to_log groups of every iteration; 0 logs none.
        transcripts_every=1 if config.num_groups_to_log > 0 else 0,
        transcript_groups=max(config.num_groups_to_log, 0),
        trace=bool(config.enable_trace),
        timeline_every=config.span_chart_every,
    )


def effective_termination(config: Any) -> Any:
    """0.6.1's ``Config.effective_termination()``: the explicit policy, else the model's default.

    That default is the agentic grade-then-clamp policy for ``thinkingmachines/Inkling`` models, None otherwise.
    """
    if config.termination is not None:
        return config.termination
    return default_rollout_config_for_model(config.model_name).termination


def has_checkpoints(log_path: str | Path) -> bool:
    """Whether 0.6.1 would resume from ``log_path`` (it holds a checkpoint record)."""
    path = Path(log_path) / CHECKPOINTS_FILE
    return path.exists() and path.stat().st_size > 0


def _kl_reference(value: Any) -> KLReferenceConfig | None:
    if value is None:
        return None
    return KLReferenceConfig(base_model=value.base_model, load_checkpoint_path=value.load_checkpoint_path)


def _async(value: Any) -> native.AsyncConfig | None:
    if value is None:
        return None
    return native.AsyncConfig(
        max_steps_off_policy=steps_ahead(value),
        groups_per_batch=value.groups_per_batch,
        staleness="oldest_first",
        loss_fn=value.loss_fn,
    )


def steps_ahead(value: Any) -> int:
    """K of an AsyncConfig: ``max_steps_off_policy``, or ``sampling_steps_ahead`` (its newer name).

    Raises:
        ConfigError: if both are given with different values, or neither.
    """
    old = getattr(value, "max_steps_off_policy", None)
    new = getattr(value, "sampling_steps_ahead", None)
    if old is not None and new is not None and old != new:
        raise ConfigError(
            "async_config.sampling_steps_ahead",
            f"{new} differs from max_steps_off_policy={old}; they are one knob (its old and new name), give one",
        )
    chosen = old if old is not None else new
    if chosen is None:
        raise ConfigError("async_config.max_steps_off_policy", "give max_steps_off_policy (or sampling_steps_ahead)")
    return int(chosen)


def _stream(value: Any) -> native.StreamMinibatchConfig | None:
    if value is None:
        return None
    return native.StreamMinibatchConfig(groups_per_batch=value.groups_per_batch, num_minibatches=value.num_minibatches)


_STRATEGIES: dict[type[Any], Callable[[Any], ErrorStrategy]] = {
    cookbook_strategy.FailFast: lambda s: FailFast(),
    cookbook_strategy.RetryOnFailure: lambda s: RetryOnFailure(
        max_retries=s.max_retries, per_rollout_timeout=s.per_rollout_timeout or None
    ),
    cookbook_strategy.MinViableGroup: lambda s: MinViableGroup(
        min_successful=s.min_successful, max_retries=s.max_retries, per_rollout_timeout=s.per_rollout_timeout
    ),
}


def _strategy(value: Any) -> bool | ErrorStrategy | None:
    """0.6.1's ``rollout_error_tolerance``: None and booleans as they are, its strategies as trio_rl's."""
    if value is None or isinstance(value, bool):
        return value
    for cls, convert in _STRATEGIES.items():
        if type(value) is cls:
            return convert(value)
    if isinstance(value, (FailFast, RetryOnFailure, MinViableGroup)):
        return value
    raise ConfigError(
        "rollout_error_tolerance",
        f"{type(value).__name__} is a rollout strategy trio_rl cannot run (it runs FailFast, RetryOnFailure, "
        "MinViableGroup)",
    )


def termination_policy(value: Any) -> TerminationRewardPolicy | None:
    """0.6.1's ``TerminationRewardPolicy`` (a chz class) as trio_rl's, field for field."""
    if value is None:
        return None
    return TerminationRewardPolicy(
        zero_reward_on_limit=value.zero_reward_on_limit,
        limit_stop_reasons=tuple(str(r) for r in value.limit_stop_reasons),
        skip_grading_on_timeout=value.skip_grading_on_timeout,
        grader_timeout_seconds=value.grader_timeout_seconds,
        pass_all_messages_to_grader=value.pass_all_messages_to_grader,
    )
