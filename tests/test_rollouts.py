"""Single, multi-turn and group rollouts, cleanup, and the error strategies."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pytest
import trio
from tinker import types as tinker_types

from trio_rl import FailFast, GroupFailedError, MinViableGroup, RetryOnFailure, do_group_rollout, do_single_rollout
from trio_rl.rl.rollouts import ParamsPerCall, SamplingPolicy, TokenPolicy, group_envs
from trio_rl.testing import FakeBackend, FakeEnv, FakeEnvGroupBuilder, FakeEnvSpec, FakeSamplingClient
from trio_rl.types import Env, StepResult


def policies(backend: FakeBackend, seed: int = 0) -> Callable[[int, int], TokenPolicy]:
    client = FakeSamplingClient(backend, version=0, model_path=None)

    def policy_for(env_index: int, attempt: int) -> TokenPolicy:
        return SamplingPolicy(client, tinker_types.SamplingParams(max_tokens=4), seed * 1000 + env_index * 10 + attempt)

    return policy_for


async def test_single_turn_rollout_records_one_transition() -> None:
    env = FakeEnv((0, 0), 0, FakeEnvSpec(turns=1), attempt=0, log=[])
    trajectory = await do_single_rollout(policies(FakeBackend())(0, 0), env)
    assert len(trajectory.transitions) == 1
    transition = trajectory.transitions[0]
    assert transition.episode_done
    assert len(transition.ac.tokens) == len(transition.ac.logprobs) >= 1
    assert trajectory.final_ob.to_ints()[: transition.ob.length] == transition.ob.to_ints()


async def test_multi_turn_rollout_feeds_each_observation_back() -> None:
    env = FakeEnv((0, 0), 0, FakeEnvSpec(turns=3), attempt=0, log=[])
    trajectory = await do_single_rollout(policies(FakeBackend())(0, 0), env)
    assert len(trajectory.transitions) == 3
    assert [t.episode_done for t in trajectory.transitions] == [False, False, True]
    for before, after in itertools.pairwise(trajectory.transitions):
        assert after.ob.to_ints()[: before.ob.length] == before.ob.to_ints()


async def test_policy_seeds_differ_per_turn_and_repeat_per_identity() -> None:
    backend = FakeBackend()
    for _ in range(2):
        env = FakeEnv((0, 0), 0, FakeEnvSpec(turns=2), attempt=0, log=[])
        await do_single_rollout(policies(backend)(0, 0), env)
    seeds = [c.detail["seed"] for c in backend.calls_of("sample")]
    assert seeds[0] != seeds[1]
    assert seeds[:2] == seeds[2:]


async def test_group_rollout_computes_group_rewards_and_cleans_up() -> None:
    log: list[str] = []
    builder = FakeEnvGroupBuilder((0, 0), FakeEnvSpec(group_size=3), log)
    group = await do_group_rollout(builder, policies(FakeBackend()))
    assert len(group.trajectories_G) == 3
    assert group.metrics_G == [{"group_size": 3}] * 3
    assert log[-1] == "cleanup (0, 0)"


async def test_cleanup_runs_even_when_the_group_is_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    builder = FakeEnvGroupBuilder((0, 0), FakeEnvSpec(group_size=2, hang_at={(0, 0)}), log)
    with trio.move_on_after(5):
        await do_group_rollout(builder, policies(FakeBackend()))
    assert "hang (0, 0)" in log
    assert log[-1] == "cleanup (0, 0)"


async def test_fail_fast_cancels_siblings_and_raises_the_original_error(autojump_clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    spec = FakeEnvSpec(group_size=3, step_latency=10.0, fail_at={(0, 0): "step"}, error=KeyError)
    builder = FakeEnvGroupBuilder((0, 0), spec, log)
    # The env's own exception, not a group around it, as tinker-cookbook 0.6.1's do_group_rollout raises it.
    with trio.fail_after(100), pytest.raises(KeyError, match="failed in step"):
        await do_group_rollout(builder, policies(FakeBackend()), FailFast())
    # The failing env raised at once; the others were cancelled, not awaited.
    assert trio.current_time() < 10.0
    assert log[-1] == "cleanup (0, 0)"


class EveryEnvCrashes(FakeEnvGroupBuilder):
    """A fake group whose every env raises in ``step``, all at the same instant."""

    async def make_envs(self) -> Sequence[FakeEnv]:
        return [CrashingEnv(self.key, i, self.spec, 0, self.log) for i in range(self.spec.group_size)]


class CrashingEnv(FakeEnv):
    async def step(self, action: list[int], *, extra: object = None) -> StepResult:
        # Shielded, so that the first crash's cancel cannot stop the other env from crashing too.
        with trio.CancelScope(shield=True):
            await trio.sleep(1.0)
        raise EnvCrash(f"env {self.index} crashed")


async def test_fail_fast_raises_every_error_when_several_envs_fail_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    builder = EveryEnvCrashes((0, 0), FakeEnvSpec(group_size=2), log=[])
    # Both rollouts fail at once: neither error is lost, so they come as one group.
    with trio.fail_after(100), pytest.RaisesGroup(EnvCrash, EnvCrash, flatten_subgroups=True) as caught:
        await do_group_rollout(builder, policies(FakeBackend()), FailFast())
    leaves = caught.value.split(EnvCrash)[0]
    assert leaves is not None
    assert sorted(str(e) for e in _leaves(leaves)) == ["env 0 crashed", "env 1 crashed"]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


async def test_retry_on_failure_retries_one_fresh_env_and_records_errors() -> None:
    log: list[str] = []
    spec = FakeEnvSpec(group_size=3, fail_at={(0, 0): "step"}, fail_attempts=1)
    builder = FakeEnvGroupBuilder((0, 0), spec, log)
    group = await do_group_rollout(builder, policies(FakeBackend()), RetryOnFailure(max_retries=2))
    assert len(group.trajectories_G) == 3
    assert [(e.env_index, e.attempt) for e in group.rollout_errors] == [(0, 0)]
    assert isinstance(group.rollout_errors[0].error, RuntimeError)
    # One env rebuilt for the one failed slot; the group was built once.
    assert log.count("make_env (0, 0) 0") == 1
    assert log.count("make_envs (0, 0)") == 1


async def test_retry_on_failure_raises_when_retries_run_out() -> None:
    spec = FakeEnvSpec(group_size=2, fail_at={(0, 0): "step"}, fail_attempts=None)
    builder = FakeEnvGroupBuilder((0, 0), spec, [])
    with pytest.raises(GroupFailedError, match="budget of 2 retries ran out") as info:
        await do_group_rollout(builder, policies(FakeBackend()), RetryOnFailure(max_retries=2))
    assert [(e.env_index, e.attempt) for e in info.value.errors] == [(0, 0), (0, 1), (0, 2)]
    assert isinstance(info.value.__cause__, RuntimeError)


async def test_a_hung_rollout_times_out_and_is_retried(autojump_clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    spec = FakeEnvSpec(group_size=2, hang_at={(0, 0)})
    builder = FakeEnvGroupBuilder((0, 0), spec, log)
    with trio.fail_after(100):
        group = await do_group_rollout(
            builder, policies(FakeBackend()), RetryOnFailure(max_retries=1, per_rollout_timeout=5.0)
        )
    assert len(group.trajectories_G) == 2
    (error,) = group.rollout_errors
    assert error.timed_out and error.env_index == 0
    assert trio.current_time() == pytest.approx(5.0)


class _SlotsZeroAndOneFail(FakeEnvGroupBuilder):
    """Slots 0 and 1 fail in their first step, at the same instant; a fresh env of any slot succeeds."""

    async def make_envs(self) -> Sequence[Env]:
        envs = [env for env in await super().make_envs() if isinstance(env, FakeEnv)]
        for env in envs[:2]:
            env.spec = FakeEnvSpec(fail_at={self.key: "step"})
            env.index = 0  # the fake fails env 0 of a failing key
        return envs


async def test_min_viable_group_keeps_the_survivors_above_the_floor() -> None:
    class TwoFailing(_SlotsZeroAndOneFail):
        async def make_env(self, index: int) -> FakeEnv:
            return FakeEnv(self.key, 0, FakeEnvSpec(fail_at={self.key: "step"}), 0, self.log)

    builder = TwoFailing((0, 0), FakeEnvSpec(group_size=4), [])
    group = await do_group_rollout(builder, policies(FakeBackend()), MinViableGroup(min_successful=2, max_retries=0))
    assert len(group.trajectories_G) == 2
    assert sorted((e.env_index, e.attempt) for e in group.rollout_errors) == [(0, 0), (1, 0)]
    # Below the floor, the group's budget of 2 retries is spent, one per failing slot.
    with pytest.raises(GroupFailedError, match="needs 3") as info:
        await do_group_rollout(builder, policies(FakeBackend()), MinViableGroup(min_successful=3, max_retries=2))
    assert sorted((e.env_index, e.attempt) for e in info.value.errors) == [(0, 0), (0, 1), (1, 0), (1, 1)]


async def test_the_last_retry_goes_to_the_first_slot_whatever_order_trio_runs_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Trio runs the tasks of one scheduler pass in a random order; twenty groups
    # would show either slot winning if that order decided. (Under RetryOnFailure
    # a spent budget fails the whole group, so only MinViableGroup can tell.)
    retried = set()
    with trio.fail_after(60):
        for _ in range(20):
            builder = _SlotsZeroAndOneFail((0, 0), FakeEnvSpec(group_size=4), [])
            group = await do_group_rollout(builder, policies(FakeBackend()), MinViableGroup(3, max_retries=1))
            assert len(group.trajectories_G) == 3
            retried.add(tuple(line for line in builder.log if line.startswith("make_env ")))
    assert retried == {("make_env (0, 0) 0",)}


def test_error_strategy_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="max_retries"):
        RetryOnFailure(max_retries=-1)
    with pytest.raises(ValueError, match="per_rollout_timeout"):
        RetryOnFailure(per_rollout_timeout=-1)
    with pytest.raises(ValueError, match="min_successful"):
        MinViableGroup(min_successful=0)


class CleanupBroke(Exception):
    pass


class CleanupFailsBuilder(FakeEnvGroupBuilder):
    """A fake group whose cleanup raises, as a leaking resource would."""

    async def cleanup(self) -> None:
        raise CleanupBroke(f"cleanup of {self.key} failed")


async def test_a_failing_cleanup_does_not_hide_the_rollout_crash() -> None:
    spec = FakeEnvSpec(fail_at={(0, 0): "step"}, error=ValueError)
    builder = CleanupFailsBuilder((0, 0), spec, log=[])
    with trio.fail_after(10):
        with pytest.RaisesGroup(
            pytest.RaisesExc(ValueError, match="failed in step"), CleanupBroke, flatten_subgroups=True
        ) as caught:
            await do_group_rollout(builder, policies(FakeBackend()))
    # The original is a leaf that except* can match, not a __context__.
    matched, _ = caught.value.split(ValueError)
    assert matched is not None


async def test_a_failing_cleanup_after_a_good_rollout_is_raised() -> None:
    builder = CleanupFailsBuilder((0, 0), FakeEnvSpec(), log=[])
    with trio.fail_after(10), pytest.raises(CleanupBroke):
        await do_group_rollout(builder, policies(FakeBackend()))


def test_params_per_call_equal_a_model_copy_with_stop_and_seed() -> None:
    params = tinker_types.SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9)
    made = ParamsPerCall(params)([3, 4], 11)
    expected = params.model_copy(update={"stop": [3, 4], "seed": 11})
    assert made == expected
    assert made.model_fields_set == expected.model_fields_set
    assert made.model_dump(exclude_unset=True) == expected.model_dump(exclude_unset=True)
    assert params.seed is None and params.stop is None  # the shared params are untouched


def test_only_an_overridden_cleanup_counts_as_work() -> None:
    from trio_rl.rl.rollouts import _cleanup_is_a_no_op
    from trio_rl.types import EnvGroupBuilder

    class DuckTyped:  # a builder without cleanup: nothing to release
        async def make_envs(self) -> list[FakeEnv]:
            return []

    assert _cleanup_is_a_no_op(EnvGroupBuilder)
    assert _cleanup_is_a_no_op(DuckTyped)
    assert not _cleanup_is_a_no_op(FakeEnvGroupBuilder)


class EnvCrash(Exception):
    pass


async def crash() -> None:
    raise EnvCrash("the env crashed")


@pytest.mark.parametrize("crashing", ["the group's own task", "a rollout task"])
async def test_a_failing_cleanup_is_raised_beside_a_crash_that_came_with_a_cancel(crashing: str) -> None:
    # The group receives BaseExceptionGroup([EnvCrash, Cancelled]): its scope was
    # cancelled (a stale group given up) at the instant one of its rollouts crashed.
    builder = CleanupFailsBuilder((0, 0), FakeEnvSpec(), log=[])
    with trio.fail_after(10):
        with pytest.RaisesGroup(EnvCrash, CleanupBroke, flatten_subgroups=True), trio.CancelScope() as given_up:
            async with group_envs(builder):
                given_up.cancel()
                async with trio.open_nursery() as nursery:
                    # A task's code runs until its first checkpoint: cancelled or not, it raises.
                    nursery.start_soon(crash if crashing == "a rollout task" else trio.sleep_forever)
                    if crashing == "the group's own task":
                        await crash()
                    await trio.sleep_forever()


async def test_a_failing_cleanup_after_a_cancel_alone_is_the_one_error() -> None:
    builder = CleanupFailsBuilder((0, 0), FakeEnvSpec(), log=[])
    with trio.fail_after(10), pytest.raises(CleanupBroke), trio.CancelScope() as cancelled:
        async with group_envs(builder):
            cancelled.cancel()
            await trio.sleep_forever()
