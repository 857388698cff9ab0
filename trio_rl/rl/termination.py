"""Rewards and the stop reason: tinker-cookbook 0.6.1's ``TerminationRewardPolicy`` (``rl/rollout_limits.py``).

Grade normally, then clamp: a trajectory that stopped on a limit (its
:attr:`~trio_rl.types.Trajectory.stop_reason` is one of ``limit_stop_reasons``)
is graded like any other, and its total reward is then lowered to at most 0.
Negative rewards, and the comparison with the group's members that finished,
survive. Applied after ``compute_group_rewards``, as 0.6.1's ``do_group_rollout``
does.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from ..types import Metrics, StopReason, Trajectory

DEFAULT_LIMIT_STOP_REASONS: tuple[str, ...] = (
    StopReason.MAX_TOKENS,
    StopReason.MAX_SAMPLED_TOKENS,
    StopReason.MAX_TURNS,
    StopReason.MAX_TOOL_CALLS,
    StopReason.ROLLOUT_TIMEOUT,
)
"""The stop reasons a budget imposes (0.6.1's default ``limit_stop_reasons``)."""

CLAMPED_METRIC_KEY = "zero_reward_on_limit"
"""Set to 1.0 in the group metrics of a trajectory whose reward was clamped (0.6.1's key)."""

Graded = list[tuple[float, Metrics]]


@dataclass(frozen=True)
class TerminationRewardPolicy:
    """How a trajectory's reward depends on the stop reason it ended with.

    Attributes:
        zero_reward_on_limit: clamp the total reward of a limit-stopped trajectory to
            ``min(reward, 0.0)`` after grading (default False: rewards untouched).
        limit_stop_reasons: the stop reasons that count as limits.
        skip_grading_on_timeout: skip ``compute_group_rewards`` (every reward 0.0) when
            every trajectory of the group stopped with ``rollout_timeout``, the clamp is
            on and ``rollout_timeout`` is a limit: the clamp would leave at most 0 anyway.
        grader_timeout_seconds: seconds ``compute_group_rewards`` may take; a slower one
            raises ``TimeoutError`` (a group failure for the error strategy). None: no bound.
        pass_all_messages_to_grader: read by envs that grade at episode end
            (the cookbook's ``AgentToolMessageEnv``), not by the loop.
    """

    zero_reward_on_limit: bool = False
    limit_stop_reasons: tuple[str, ...] = DEFAULT_LIMIT_STOP_REASONS
    skip_grading_on_timeout: bool = False
    grader_timeout_seconds: float | None = None
    pass_all_messages_to_grader: bool = False

    def __post_init__(self) -> None:
        # A tuple of plain strings whatever it was given as (a list read back from config.json, StopReasons).
        object.__setattr__(self, "limit_stop_reasons", tuple(str(r) for r in self.limit_stop_reasons))
        timeout = self.grader_timeout_seconds
        if timeout is not None and not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"grader_timeout_seconds must be a positive number of seconds or None, not {timeout}")

    def skips_grading(self, trajectories: Sequence[Trajectory]) -> bool:
        """Whether the group's grading can be skipped: every member timed out and would be clamped."""
        return (
            self.skip_grading_on_timeout
            and self.zero_reward_on_limit
            and StopReason.ROLLOUT_TIMEOUT in self.limit_stop_reasons
            and len(trajectories) > 0
            and all(t.stop_reason == StopReason.ROLLOUT_TIMEOUT for t in trajectories)
        )

    def clamp(self, trajectories: Sequence[Trajectory], graded: Graded) -> Graded:
        """The group's ``(final reward, metrics)`` with each limit-stopped total lowered to at most 0.

        The total is the per-step rewards plus the group reward, so the group reward
        becomes minus the steps' sum (exactly 0, no floating-point residue).
        """
        if not self.zero_reward_on_limit:
            return graded
        out: Graded = []
        for trajectory, (reward, metrics) in zip(trajectories, graded, strict=True):
            step_sum = sum(t.reward for t in trajectory.transitions)
            limited = trajectory.stop_reason is not None and trajectory.stop_reason in self.limit_stop_reasons
            if limited and step_sum + reward > 0.0:
                out.append((-step_sum, {**metrics, CLAMPED_METRIC_KEY: 1.0}))
            else:
                out.append((reward, metrics))
        return out


async def grade_group(
    policy: TerminationRewardPolicy | None,
    trajectories: Sequence[Trajectory],
    grade: Callable[[], Awaitable[Graded]],
) -> Graded:
    """Grade a group under ``policy``: maybe skip, bound the grader's time, then clamp.

    Args:
        policy: the run's termination policy (None: ``grade()`` as it is).
        trajectories: the group's trajectories, in order.
        grade: calls ``compute_group_rewards``.

    Raises:
        TimeoutError: the grader ran past ``grader_timeout_seconds``.
    """
    if policy is None:
        return await grade()
    if policy.skips_grading(trajectories):
        return [(0.0, {}) for _ in trajectories]
    if policy.grader_timeout_seconds is None:
        graded = await grade()
    else:
        with trio.move_on_after(policy.grader_timeout_seconds) as scope:
            graded = await grade()
        if scope.cancelled_caught:
            raise TimeoutError(f"compute_group_rewards took longer than {policy.grader_timeout_seconds} s")
    return policy.clamp(trajectories, list(graded))
