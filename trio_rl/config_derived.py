"""What a ``Config`` selects and sends, derived from its fields: the bodies of its methods.

Its mode's schedule, its rollout error strategy, and the parameters every ``optim_step``
and sample call carries. ``Config`` keeps the fields and their docs; the logic lives here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tinker import types as tinker_types

from .loop.oldest_first import OldestFirst
from .loop.schedules import Pace, Requeue, Schedule, Stream, Sync
from .rl.rollouts import ErrorStrategy, default_rollout_strategy_for_model, rollout_strategy_from_config

if TYPE_CHECKING:
    from .config import Config


def schedule_for(config: Config, dataset_batch_size: int) -> Schedule:
    """The schedule of the mode ``config`` selects (the body of ``Config.schedule``)."""
    if config.async_config is not None:
        ac = config.async_config
        if ac.staleness == "oldest_first":
            return OldestFirst(
                ac.groups_per_batch, config.num_substeps, ac.max_steps_off_policy, config.remove_constant_reward_groups
            )
        policy = Pace if ac.staleness == "pace" else Requeue
        return policy(ac.groups_per_batch, config.num_substeps, ac.max_steps_off_policy)
    if config.stream_minibatch_config is not None:
        sc = config.stream_minibatch_config
        return Stream(sc.groups_per_batch, sc.num_minibatches, config.num_substeps)
    return Sync(max(1, dataset_batch_size), config.num_substeps)


def rollout_strategy(config: Config) -> ErrorStrategy:
    """The error strategy ``config.rollout_error_tolerance`` selects (the body of ``Config.rollout_strategy``).

    Raises:
        TypeError: the tolerance is neither None, a bool nor an error strategy.
    """
    if config.rollout_error_tolerance is None:
        return default_rollout_strategy_for_model(config.base_model)
    return rollout_strategy_from_config(config.rollout_error_tolerance)


def adam_params(config: Config) -> tinker_types.AdamParams:
    """The ``AdamParams`` of ``config``'s optimizer fields (the body of ``Config.adam_params``)."""
    return tinker_types.AdamParams(
        learning_rate=config.learning_rate,
        beta1=config.adam_beta1,
        beta2=config.adam_beta2,
        eps=config.adam_eps,
        weight_decay=config.weight_decay,
        grad_clip_norm=config.grad_clip_norm,
    )


def sampling_params(config: Config) -> tinker_types.SamplingParams:
    """The ``SamplingParams`` of ``config``'s sampling fields (the body of ``Config.sampling_params``)."""
    return tinker_types.SamplingParams(
        max_tokens=config.max_tokens, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p
    )
