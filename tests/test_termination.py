"""trio_rl.rl.termination: tinker-cookbook 0.6.1's grade-then-clamp TerminationRewardPolicy."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
from tinker import types as tinker_types

from trio_rl.rl.rollouts import do_group_rollout
from trio_rl.rl.termination import CLAMPED_METRIC_KEY, TerminationRewardPolicy, grade_group
from trio_rl.types import (
    STOP_METRIC_PREFIX,
    Env,
    EnvGroupBuilder,
    StepResult,
    StopCondition,
    StopReason,
    TokensWithLogprobs,
    Trajectory,
    Transition,
)


def trajectory(step_rewards: list[float], stop_reason: str | None) -> Trajectory:
    ob = tinker_types.ModelInput.from_ints([1, 2])
    transitions = [
        Transition(ob=ob, ac=TokensWithLogprobs(tokens=[3], maybe_logprobs=[-0.1]), reward=r, episode_done=False)
        for r in step_rewards
    ]
    return Trajectory(transitions=transitions, final_ob=ob, stop_reason=stop_reason)


def make_group() -> list[Trajectory]:
    # Made per test, not kept at module level: a test elsewhere counts the Trajectory objects alive.
    return [
        trajectory([0.5], StopReason.MAX_TOKENS),  # limit, positive total: clamped to 0
        trajectory([0.0], StopReason.MAX_TURNS),  # limit, negative total: unchanged
        trajectory([0.25], StopReason.COMPLETED),  # not a limit: unchanged
        trajectory([0.0], None),  # no stop reason: unchanged
    ]
GRADED = [(1.0, {"correct": 1.0}), (-0.5, {}), (1.0, {}), (2.0, {})]


def test_clamp_lowers_only_positive_limit_stopped_totals_to_zero() -> None:
    clamped = TerminationRewardPolicy(zero_reward_on_limit=True).clamp(make_group(), GRADED)
    assert clamped == [(-0.5, {"correct": 1.0, CLAMPED_METRIC_KEY: 1.0}), (-0.5, {}), (1.0, {}), (2.0, {})]
    # The total (steps plus group reward) is exactly 0.
    assert sum(t.reward for t in make_group()[0].transitions) + clamped[0][0] == 0.0


def test_without_zero_reward_on_limit_nothing_changes() -> None:
    assert TerminationRewardPolicy().clamp(make_group(), GRADED) == GRADED


def test_limit_stop_reasons_choose_what_counts_as_a_limit() -> None:
    policy = TerminationRewardPolicy(zero_reward_on_limit=True, limit_stop_reasons=(StopReason.MAX_TURNS,))
    assert policy.clamp(make_group(), GRADED) == GRADED  # the max_tokens member is no longer a limit


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
        await grade_group(TerminationRewardPolicy(grader_timeout_seconds=5), [make_group()[2]], slow)


async def test_no_policy_grades_as_it_is() -> None:
    async def grade() -> list[tuple[float, dict[str, float]]]:
        return list(GRADED)

    assert await grade_group(None, make_group(), grade) == GRADED


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan")])
def test_a_grader_timeout_must_be_positive_seconds(bad: float) -> None:
    with pytest.raises(ValueError, match="grader_timeout_seconds"):
        TerminationRewardPolicy(grader_timeout_seconds=bad)


class LimitedEnv(Env):
    """One step, rewarded 0.5; ``stop`` names the stop reason it reports (``stop/<reason>``)."""

    def __init__(self, stop: str) -> None:
        self.stop = stop

    async def initial_observation(self) -> tuple[tinker_types.ModelInput, StopCondition]:
        return tinker_types.ModelInput.from_ints([1, 2]), []

    async def step(self, action: list[int], *, extra: object = None) -> StepResult:
        return StepResult(
            reward=0.5,
            episode_done=True,
            next_observation=tinker_types.ModelInput.from_ints([1, 2, *action]),
            next_stop_condition=[],
            metrics={f"{STOP_METRIC_PREFIX}{self.stop}": 1.0},
        )


class LimitedGroup(EnvGroupBuilder):
    async def make_envs(self) -> list[Env]:
        return [LimitedEnv(StopReason.MAX_TOKENS), LimitedEnv(StopReason.COMPLETED)]

    async def compute_group_rewards(
        self, trajectories: Sequence[Trajectory], envs: Sequence[Env]
    ) -> list[tuple[float, dict[str, float]]]:
        return [(1.0, {}) for _ in trajectories]


class OneTokenPolicy:
    async def __call__(self, ob: tinker_types.ModelInput, stop: StopCondition) -> TokensWithLogprobs:
        return TokensWithLogprobs(tokens=[3], maybe_logprobs=[-0.1])


@pytest.mark.parametrize("policy", [None, TerminationRewardPolicy(zero_reward_on_limit=True)])
async def test_do_group_rollout_clamps_under_the_policy(policy: TerminationRewardPolicy | None) -> None:
    group = await do_group_rollout(LimitedGroup(), lambda env, attempt: OneTokenPolicy(), termination=policy)
    assert [t.stop_reason for t in group.trajectories_G] == ["max_tokens", "completed"]
    totals = [0.5 + r for r in group.final_rewards_G]
    assert totals == ([0.0, 1.5] if policy is not None else [1.5, 1.5])
