"""The configuration of the two modes besides sync: stream minibatches and async (off-policy) training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from ..errors import ConfigError
from .checks import divides, positive

Staleness = Literal["oldest_first", "pace", "requeue"]
"""The async policies :attr:`AsyncConfig.staleness` names."""

STALENESS_POLICIES: tuple[str, ...] = get_args(Staleness)
"""Every value of :data:`Staleness`, in its order (the first is the default)."""


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
        positive("stream_minibatch_config.groups_per_batch", self.groups_per_batch, "at least 1")
        positive("stream_minibatch_config.num_minibatches", self.num_minibatches, "at least 1")
        divides(
            "stream_minibatch_config.groups_per_batch",
            self.groups_per_batch,
            "stream_minibatch_config.num_minibatches",
            self.num_minibatches,
        )
        divides("stream_minibatch_config.num_minibatches", self.num_minibatches, "num_substeps", num_substeps)
        if dataset_batch_size is not None and dataset_batch_size != self.groups_per_batch:
            raise ConfigError(
                "stream_minibatch_config.groups_per_batch",
                f"is {self.groups_per_batch} but the dataset's batches hold {dataset_batch_size} groups; "
                "make them equal",
            )


@dataclass(frozen=True)
class AsyncConfig:
    """Off-policy training: rollouts keep sampling while the trainer trains.

    A field's docstring is also the help of its flag on the command line
    (:mod:`trio_rl.cli.config_flags`), where ``groups_per_batch`` is the run's
    ``--groups-per-batch`` and ``loss_fn`` is ``--loss-fn``.
    """

    max_steps_off_policy: int | None
    """async only: K, how many steps behind the trainer a group's sampling weights may be when it is trained
    (None: take it from sampling_steps_ahead)"""
    groups_per_batch: int
    """groups per training step"""
    staleness: Staleness = "oldest_first"
    """async only: oldest_first (the default; tinker-cookbook 0.6.1's do_async_training: groups_per_batch * (K + 1)
    rollout slots, each step trains the groups_per_batch completed groups sampled from the oldest weights, leftovers
    carry over, a slow group is trained when it finishes however stale, nothing is discarded), pace (the strict bound
    of tinker-cookbook PR #822, unreleased: each group's step is fixed when it is handed out, no group is more than K
    steps stale, a step waits for its stragglers) or requeue (tinker-cookbook 0.5.5: groups more than K steps stale
    are resampled while the dataset has data, and dropped, counted, afterwards)"""
    loss_fn: str | None = None
    """the loss async runs train with, in place of Config.loss_fn, as in tinker-cookbook 0.6.1; None (the default)
    resolves per backend before any work (trio_rl.async_loss): stable_reinforce on Tinker and FakeBackend, as in the
    cookbook; on LocalBackend and HFBackend, which lack it, importance_sampling with token-level truncated importance
    sampling (loss_fn_config tis_cap 2.0 unless Config.loss_fn_config is set); a Config.loss_fn other than its default
    and the resolved value is refused"""
    inflight_weights: bool = False
    """async only: publish each step's weights in flight, so running rollouts adopt them between tokens (needs
    staleness oldest_first and num_substeps 1)"""
    sampling_steps_ahead: int | None = None
    """async only: K under the name tinker-cookbook gives it after 0.6.1, the same knob as max_steps_off_policy
    (give either, or both with one value); once constructed K is max_steps_off_policy and this reads None"""

    def __post_init__(self) -> None:
        old, new = self.max_steps_off_policy, self.sampling_steps_ahead
        if old is not None and new is not None and old != new:
            raise ConfigError(
                "async_config.sampling_steps_ahead",
                f"{new} differs from max_steps_off_policy={old}; they are one knob (its old and new name), give one",
            )
        if old is None and new is None:
            raise ConfigError(
                "async_config.max_steps_off_policy", "give K, as max_steps_off_policy or sampling_steps_ahead"
            )
        # One canonical spelling, so that equal configurations compare (and write config.json) alike.
        object.__setattr__(self, "max_steps_off_policy", old if old is not None else new)
        object.__setattr__(self, "sampling_steps_ahead", None)

    @property
    def steps_ahead(self) -> int:
        """K, whichever name gave it."""
        assert self.max_steps_off_policy is not None, "resolved in __post_init__"
        return self.max_steps_off_policy

    def validate(self, num_substeps: int) -> None:
        """Reject a negative K, an empty step, an unknown policy, or steps that substeps cannot split.

        Raises:
            ConfigError: naming the field at fault.
        """
        if self.steps_ahead < 0:
            raise ConfigError("async_config.max_steps_off_policy", f"K must be >= 0, got {self.steps_ahead}")
        positive("async_config.groups_per_batch", self.groups_per_batch, "at least 1 group per step")
        if self.staleness not in STALENESS_POLICIES:
            *others, last = map(repr, STALENESS_POLICIES)
            raise ConfigError("async_config.staleness", f"use {', '.join(others)} or {last}, not {self.staleness!r}")
        divides("async_config.groups_per_batch", self.groups_per_batch, "num_substeps", num_substeps)
        if self.inflight_weights and self.staleness != "oldest_first":
            raise ConfigError(
                "async_config.inflight_weights",
                f"in-flight weights need staleness='oldest_first', not {self.staleness!r}: a rollout's tokens "
                "come from ever newer weights, so neither a step fixed at hand-out nor resampling stale groups applies",
            )
        if self.inflight_weights and num_substeps != 1:
            raise ConfigError(
                "async_config.inflight_weights",
                f"in-flight weights need num_substeps=1, not {num_substeps}: a backend tells each token's weights "
                "version in optimizer steps, which count training steps only when a step takes one",
            )
