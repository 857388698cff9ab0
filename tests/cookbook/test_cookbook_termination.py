"""trio_rl's TerminationRewardPolicy clamps as tinker-cookbook 0.6.1's ``do_group_rollout`` does, side by side."""

from __future__ import annotations

import itertools

import pytest
import tinker
from tinker_cookbook.completers import TokensWithLogprobs
from tinker_cookbook.rl import rollouts as cookbook_rollouts
from tinker_cookbook.rl.rollout_limits import DEFAULT_LIMIT_STOP_REASONS
from tinker_cookbook.rl.rollout_limits import TerminationRewardPolicy as CookbookPolicy
from tinker_cookbook.rl.types import StopReason, Trajectory, Transition

from trio_rl import types as ours
from trio_rl.cookbook.fields import termination_policy
from trio_rl.rl.termination import TerminationRewardPolicy

REASONS = [None, StopReason.COMPLETED, StopReason.MAX_TOKENS, StopReason.MAX_TURNS, StopReason.ROLLOUT_TIMEOUT]


def trajectory(step_reward: float, stop_reason: str | None) -> Trajectory:
    ob = tinker.ModelInput.from_ints([1])
    step = Transition(
        ob=ob, ac=TokensWithLogprobs(tokens=[2], maybe_logprobs=[-0.1]), reward=step_reward, episode_done=True
    )
    return Trajectory(transitions=[step], final_ob=ob, stop_reason=stop_reason)


def as_ours(trajectory: Trajectory) -> ours.Trajectory:
    """The same trajectory as trio_rl's rollouts record it (trio_rl's classes, the same fields)."""
    transitions = [
        ours.Transition(
            ob=t.ob,
            ac=ours.TokensWithLogprobs(tokens=t.ac.tokens, maybe_logprobs=t.ac.maybe_logprobs),
            reward=t.reward,
            episode_done=t.episode_done,
        )
        for t in trajectory.transitions
    ]
    return ours.Trajectory(transitions=transitions, final_ob=trajectory.final_ob, stop_reason=trajectory.stop_reason)


@pytest.mark.parametrize("zero_reward_on_limit", [False, True])
@pytest.mark.parametrize("limits", [None, (StopReason.MAX_TURNS, StopReason.ROLLOUT_TIMEOUT)])
def test_the_clamp_matches_0_6_1(zero_reward_on_limit: bool, limits: tuple[str, ...] | None) -> None:
    theirs_policy = CookbookPolicy(
        zero_reward_on_limit=zero_reward_on_limit,
        limit_stop_reasons=DEFAULT_LIMIT_STOP_REASONS if limits is None else limits,
    )
    ours_policy = termination_policy(theirs_policy)
    assert isinstance(ours_policy, TerminationRewardPolicy)
    group = [trajectory(s, r) for s, r in itertools.product([0.0, 0.5, -1.0], REASONS)]
    group_rewards = [1.0, -0.25, 0.0, 2.0] * 4
    group_rewards = group_rewards[: len(group)]
    metrics = [{"m": float(i)} for i in range(len(group))]
    theirs_rewards, theirs_metrics = list(group_rewards), list(metrics)
    cookbook_rollouts._apply_zero_reward_on_limit(theirs_policy, group, theirs_rewards, theirs_metrics)
    clamped = ours_policy.clamp([as_ours(t) for t in group], list(zip(group_rewards, metrics, strict=True)))
    assert clamped == list(zip(theirs_rewards, theirs_metrics, strict=True))


def test_skip_grading_matches_0_6_1() -> None:
    policy = CookbookPolicy(zero_reward_on_limit=True, skip_grading_on_timeout=True)
    ours_policy = termination_policy(policy)
    assert ours_policy is not None
    for group in (
        [trajectory(0, StopReason.ROLLOUT_TIMEOUT)] * 2,
        [trajectory(0, StopReason.ROLLOUT_TIMEOUT), trajectory(0, None)],
        [],
    ):
        ours_group = [as_ours(t) for t in group]
        assert ours_policy.skips_grading(ours_group) == cookbook_rollouts._should_skip_group_grading(policy, group)
