"""trio_rl.rl.termination: tinker-cookbook 0.6.1's grade-then-clamp TerminationRewardPolicy."""

from __future__ import annotations

import pytest
import trio
from tinker import types as tinker_types

from trio_rl.rl.termination import CLAMPED_METRIC_KEY, TerminationRewardPolicy, grade_group
from trio_rl.types import StopReason, TokensWithLogprobs, Trajectory, Transition


def trajectory(step_rewards: list[float], stop_reason: str | None) -> Trajectory:
    ob = tinker_types.ModelInput.from_ints([1, 2])
    transitions = [
        Transition(ob=ob, ac=TokensWithLogprobs(tokens=[3], maybe_logprobs=[-0.1]), reward=r, episode_done=False)
        for r in step_rewards
    ]
    return Trajectory(transitions=transitions, final_ob=ob, stop_reason=stop_reason)


GROUP = [
    trajectory([0.5], StopReason.MAX_TOKENS),  # limit, positive total: clamped to 0
    trajectory([0.0], StopReason.MAX_TURNS),  # limit, negative total: unchanged
    trajectory([0.25], StopReason.COMPLETED),  # not a limit: unchanged
    trajectory([0.0], None),  # no stop reason: unchanged
]
GRADED = [(1.0, {"correct": 1.0}), (-0.5, {}), (1.0, {}), (2.0, {})]


def test_clamp_lowers_only_positive_limit_stopped_totals_to_zero() -> None:
    clamped = TerminationRewardPolicy(zero_reward_on_limit=True).clamp(GROUP, GRADED)
    assert clamped == [(-0.5, {"correct": 1.0, CLAMPED_METRIC_KEY: 1.0}), (-0.5, {}), (1.0, {}), (2.0, {})]
    # The total (steps plus group reward) is exactly 0.
    assert sum(t.reward for t in GROUP[0].transitions) + clamped[0][0] == 0.0


def test_without_zero_reward_on_limit_nothing_changes() -> None:
    assert TerminationRewardPolicy().clamp(GROUP, GRADED) == GRADED


def test_limit_stop_reasons_choose_what_counts_as_a_limit() -> None:
    policy = TerminationRewardPolicy(zero_reward_on_limit=True, limit_stop_reasons=(StopReason.MAX_TURNS,))
    assert policy.clamp(GROUP, GRADED) == GRADED  # the max_tokens member is no longer a limit


async def test_grading_is_skipped_only_when_every_member_timed_out() -> None:
    calls = 0

    async def grade() -> list[tuple[float, dict[str, float]]]:
        nonlocal calls
        calls += 1
        return [(1.0, {}), (1.0, {})]

    policy = TerminationRewardPolicy(zero_reward_on_limit=True, skip_grading_on_timeout=True)
    timed_out = [trajectory([0.0], StopReason.ROLLOUT_TIMEOUT)] * 2
    assert await grade_group(policy, timed_out, grade) == [(0.0, {}), (0.0, {})] and calls == 0
    mixed = [timed_out[0], trajectory([0.0], StopReason.COMPLETED)]
    graded = await grade_group(policy, mixed, grade)
    assert calls == 1 and graded == [(0.0, {CLAMPED_METRIC_KEY: 1.0}), (1.0, {})]


async def test_a_slow_grader_raises_timeout_error(autojump_clock: trio.testing.MockClock) -> None:
    async def slow() -> list[tuple[float, dict[str, float]]]:
        await trio.sleep(10)
        return [(1.0, {})]

    with trio.fail_after(60), pytest.raises(TimeoutError, match="longer than 5"):
        await grade_group(TerminationRewardPolicy(grader_timeout_seconds=5), [GROUP[2]], slow)


async def test_no_policy_grades_as_it_is() -> None:
    async def grade() -> list[tuple[float, dict[str, float]]]:
        return list(GRADED)

    assert await grade_group(None, GROUP, grade) == GRADED


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
def test_a_grader_timeout_must_be_positive_seconds(bad: float) -> None:
    with pytest.raises(ValueError, match="grader_timeout_seconds"):
        TerminationRewardPolicy(grader_timeout_seconds=bad)
