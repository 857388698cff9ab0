"""What a step needs to know of a rolled-out group, taken as soon as the group is rolled out."""

from __future__ import annotations

from typing import NamedTuple

from .. import _tinker_compat as compat
from ..types import RolloutError, Trajectory, TrajectoryGroup
from .data import TokenVersions, rewards_are_constant, trained_tokens_by_version


def is_initial_overflow(trajectory: Trajectory) -> bool:
    """Whether ``trajectory`` ended at once because its prompt overflowed (see :class:`~trio_rl.types.InitialObservationOverflow`)."""
    return (
        len(trajectory.transitions) == 1
        and not trajectory.transitions[0].ac.tokens
        and trajectory.transitions[0].ob.length == 0
    )


class GroupSummary(NamedTuple):
    """What a step's records need to know of one rolled-out group, taken as soon as it is rolled out.

    A finished group waits for its step holding this instead of its trajectories:
    a few numbers and tuples, which the garbage collector stops tracking, where
    the trajectories are dozens of tracked objects (observations, actions,
    transitions). Counts are kept as totals; rewards and metric values keep the
    order the trajectories had, so the metrics made from summaries are the same
    floats as those made from the groups. (A named tuple, because it is quick
    to build; the collector stops tracking its tuples of numbers.)

    Attributes:
        total_rewards: per trajectory, its step rewards plus its final group reward.
        transitions: transitions over all trajectories (the group's turns).
        ac_tokens: action tokens over all transitions.
        ob_tokens: observation tokens over all transitions.
        cached_ob_tokens: of those, the ones the sampler served from its prefix cache.
        transition_metrics: every transition's metrics, as ``(key, value)`` in order.
        group_metrics: the group's ``compute_group_rewards`` metrics, as ``(key, value)`` in order.
        initial_overflows: trajectories that ended at once on an overflowing prompt.
        rollout_errors: the group's failed rollout attempts.
        trained_tokens: action tokens that carry loss weight (those not masked).
        token_versions: those tokens tallied by the weights version that produced
            them, where the sampler said (an in-flight client of a backend that
            knows); None where it did not.
    """

    total_rewards: tuple[float, ...]
    transitions: int
    ac_tokens: int
    ob_tokens: int
    transition_metrics: tuple[tuple[str, float], ...]
    group_metrics: tuple[tuple[str, float], ...]
    initial_overflows: int
    rollout_errors: tuple[RolloutError, ...]
    cached_ob_tokens: int = 0
    trained_tokens: int = 0
    token_versions: TokenVersions | None = None

    @classmethod
    def of(cls, group: TrajectoryGroup) -> GroupSummary:
        """The summary of ``group``."""
        transitions = ac_tokens = ob_tokens = cached = overflows = 0
        values: list[tuple[str, float]] = []
        for trajectory in group.trajectories_G:
            overflows += is_initial_overflow(trajectory)
            for transition in trajectory.transitions:
                transitions += 1
                ac_tokens += len(transition.ac.tokens)
                ob_tokens += compat.token_count(transition.ob)
                cached += transition.ac.prompt_cache_hit_tokens
                values.extend((key, float(value)) for key, value in transition.metrics.items())
        trained, versions = trained_tokens_by_version(group.trajectories_G)
        return cls(
            total_rewards=tuple(group.get_total_rewards()),
            transitions=transitions,
            ac_tokens=ac_tokens,
            ob_tokens=ob_tokens,
            transition_metrics=tuple(values),
            group_metrics=tuple((k, float(v)) for metrics in group.metrics_G for k, v in metrics.items()),
            initial_overflows=overflows,
            rollout_errors=tuple(group.rollout_errors),
            cached_ob_tokens=cached,
            trained_tokens=trained,
            token_versions=versions,
        )

    @property
    def constant_reward(self) -> bool:
        """Whether every trajectory got the same total reward (no learning signal), as :func:`is_constant_reward`."""
        return rewards_are_constant(self.total_rewards)
