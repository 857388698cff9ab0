"""Rollout error tolerance as tinker-cookbook 0.6.1 defines it: one budget per group, skipped groups, a default floor."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from tests.conftest import read_jsonl
from tests.pipeline_helpers import MODES, make_config, run_fake
from tests.test_rollouts import policies
from trio_rl import FailFast, GroupFailedError, MinViableGroup, RetryOnFailure, do_group_rollout
from trio_rl.errors import ConfigError, EmptyGroupError, stops_the_run
from trio_rl.rl.rollouts import ErrorStrategy, do_single_rollout
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnv, FakeEnvGroupBuilder, FakeEnvSpec
from trio_rl.types import Env, Metrics, Trajectory


class CookbookStyleBuilder:
    """A builder as the cookbook writes them: no trio_rl base class and no ``make_env``.

    Envs listed in ``failing`` fail on their first ``failures`` builds.
    """

    def __init__(self, group_size: int, failing: set[int], failures: int | None) -> None:
        self.group_size = group_size
        self.failing = failing
        self.failures = failures
        self.builds = 0
        self.log: list[str] = []

    async def make_envs(self) -> Sequence[Env]:
        attempt, self.builds = self.builds, self.builds + 1
        envs = []
        for i in range(self.group_size):
            fails = i in self.failing and (self.failures is None or attempt < self.failures)
            # FakeEnv fails env 0 of a key whose spec says "step".
            spec = FakeEnvSpec(fail_at={(0, 0): "step"} if fails else {})
            envs.append(FakeEnv((0, 0), 0 if fails else i + 1, spec, 0, self.log))
        return envs

    async def compute_group_rewards(
        self, trajectories: list[Trajectory], envs: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectories]

    def logging_tags(self) -> list[str]:
        return []

    async def cleanup(self) -> None:
        pass


async def test_a_cookbook_builder_retries_through_make_envs() -> None:
    builder = CookbookStyleBuilder(group_size=3, failing={1}, failures=1)
    group = await do_group_rollout(builder, policies(FakeBackend()), RetryOnFailure(max_retries=1))  # type: ignore[arg-type]
    assert len(group.trajectories_G) == 3
    assert builder.builds == 2  # the group, then one group to take the fresh env from
    assert [e.error_type for e in group.rollout_errors] == ["RuntimeError"]


async def test_the_retry_budget_is_one_for_the_whole_group() -> None:
    # Two envs each fail once. A budget of one retry per env slot would save the
    # group; the cookbook's budget is one for the group, so it fails.
    builder = CookbookStyleBuilder(group_size=3, failing={0, 1}, failures=1)
    with trio.fail_after(10), pytest.raises(GroupFailedError, match="budget of 1 retries"):
        await do_group_rollout(builder, policies(FakeBackend()), RetryOnFailure(max_retries=1))  # type: ignore[arg-type]
    builder = CookbookStyleBuilder(group_size=3, failing={0, 1}, failures=1)
    group = await do_group_rollout(builder, policies(FakeBackend()), RetryOnFailure(max_retries=2))  # type: ignore[arg-type]
    assert len(group.trajectories_G) == 3


async def test_a_builder_with_make_env_retries_one_env_only() -> None:
    spec = FakeEnvSpec(group_size=3, fail_at={(0, 0): "step"}, fail_attempts=1)
    builder = FakeEnvGroupBuilder((0, 0), spec, [])
    await do_group_rollout(builder, policies(FakeBackend()), RetryOnFailure(max_retries=1))
    assert (builder.attempts, builder.retries) == (1, 1)


async def test_min_viable_group_defaults_to_a_floor_of_three_quarters() -> None:
    assert MinViableGroup().floor(4) == 3 and MinViableGroup().floor(5) == 4
    one_bad = CookbookStyleBuilder(group_size=4, failing={0}, failures=None)
    group = await do_group_rollout(one_bad, policies(FakeBackend()), MinViableGroup(max_retries=0))  # type: ignore[arg-type]
    assert len(group.trajectories_G) == 3
    two_bad = CookbookStyleBuilder(group_size=4, failing={0, 1}, failures=None)
    with pytest.raises(GroupFailedError, match="needs 3"):
        await do_group_rollout(two_bad, policies(FakeBackend()), MinViableGroup(max_retries=0))  # type: ignore[arg-type]


async def test_min_viable_group_retries_only_while_below_the_floor(autojump_clock: MockClock) -> None:
    # Env 0 always fails, after the other three have succeeded and met the
    # floor of 3: its failure is recorded but never retried.
    builder = CookbookStyleBuilder(group_size=4, failing={0}, failures=None)
    slow_failing_env = FakeBackend(sample_latency=lambda request: 5.0 if request[0].to_ints()[2] == 3 else 1.0)
    with trio.fail_after(100):
        group = await do_group_rollout(builder, policies(slow_failing_env), MinViableGroup(max_retries=3))  # type: ignore[arg-type]
    assert len(group.trajectories_G) == 3
    assert len(group.rollout_errors) == 1 and builder.builds == 1


@pytest.mark.parametrize("mode", MODES)
async def test_a_group_failing_beyond_tolerance_is_skipped_and_training_goes_on(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    spec = FakeEnvSpec(fail_at={(1, 1): "step", (2, 3): "make_envs"}, fail_attempts=None)
    dataset = FakeDataset(num_batches=4, batch_size=4, spec=spec)
    config = make_config(log_path, mode, rollout_error_tolerance=RetryOnFailure(max_retries=1))
    result = await run_fake(config, dataset)
    assert result.final_step == 4
    assert result.trained_groups == 14
    assert result.cancelled_groups == 0 and result.checkpoint is not None and result.checkpoint.outstanding == []
    summary = result.summary
    assert summary["run/groups_skipped"] == 2
    assert summary["rollout_errors/groups_skipped"] == 2.0
    # As in the cookbook, a skipped group counts only in groups_skipped, not by error type.
    assert summary["rollout_errors/total"] == 0.0


@pytest.mark.parametrize("mode", ["sync", "stream", "pace"])
async def test_a_step_whose_groups_all_failed_is_still_a_step(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    # Every group of batch 1 fails: step 1 trains nothing, and step 2 still
    # gets the weights version it waits for.
    spec = FakeEnvSpec(fail_at={(1, g): "step" for g in range(4)}, fail_attempts=None)
    dataset = FakeDataset(num_batches=3, batch_size=4, spec=spec)
    config = make_config(log_path, mode, rollout_error_tolerance=RetryOnFailure(max_retries=0))
    result = await run_fake(config, dataset)
    assert result.final_step == 3 and result.trained_groups == 8
    assert result.summary["rollout_errors/groups_skipped"] == 4.0
    assert [m["progress/groups"] for m in result.step_metrics] == [4, 0, 4]


async def test_fail_fast_still_ends_the_run(log_path: Path, autojump_clock: MockClock) -> None:
    dataset = FakeDataset(num_batches=3, batch_size=4, spec=FakeEnvSpec(fail_at={(1, 1): "step"}))
    with pytest.RaisesGroup(RuntimeError, flatten_subgroups=True):
        await run_fake(make_config(log_path, "sync", rollout_error_tolerance=FailFast()), dataset)


class NoEnvForGroup12(FakeEnvGroupBuilder):
    """Group (1, 2)'s make_envs returns no env: a defect of the env's code, not a rollout failure."""

    async def make_envs(self) -> Sequence[Env]:
        if self.key == (1, 2):
            return []
        return await super().make_envs()


class NoEnvDataset(FakeDataset):
    def get_batch(self, index: int) -> list[FakeEnvGroupBuilder]:
        return [NoEnvForGroup12((index, g), self.spec, self.log) for g in range(self.batch_sizes[index])]


@pytest.mark.parametrize(
    "strategy", [FailFast(), RetryOnFailure(max_retries=2), MinViableGroup()], ids=lambda s: type(s).__name__
)
@pytest.mark.parametrize("mode", ["sync", "requeue"])
async def test_a_make_envs_with_no_env_stops_the_run_under_every_strategy(
    log_path: Path, mode: str, strategy: ErrorStrategy, autojump_clock: MockClock
) -> None:
    config = make_config(log_path, mode, rollout_error_tolerance=strategy)
    with pytest.RaisesGroup(
        pytest.RaisesExc(EmptyGroupError, match=r"NoEnvForGroup12\.make_envs\(\) returned no envs"),
        flatten_subgroups=True,
    ):
        await run_fake(config, NoEnvDataset(num_batches=6, batch_size=4))
    # At once: the run did not go on to train the rest of the data.
    assert [r["step"] for r in read_jsonl(log_path / "metrics.jsonl") if "progress/groups" in r] in ([], [0], [0, 1])


async def test_a_retry_whose_make_envs_returns_no_env_stops_the_group_naming_the_builder() -> None:
    class EmptyOnRebuild(CookbookStyleBuilder):
        async def make_envs(self) -> Sequence[Env]:
            return await super().make_envs() if self.builds == 0 else []

    builder = EmptyOnRebuild(group_size=3, failing={1}, failures=1)
    # The lone error itself, as do_group_rollout raises a single failure (tinker-cookbook 0.6.1 does).
    with (
        trio.fail_after(10),
        pytest.raises(
            EmptyGroupError, match=r"EmptyOnRebuild\.make_envs\(\) returned no envs for a retry of env 1"
        ) as caught,
    ):
        await do_group_rollout(builder, policies(FakeBackend()), RetryOnFailure(max_retries=1))  # type: ignore[arg-type]
    assert stops_the_run(caught.value)


@dataclass
class FakeRolloutLimits:
    """tinker-cookbook 0.6.1's ``RolloutLimits`` by field name (the core imports no cookbook)."""

    max_turns: int | None = None
    max_trajectory_tokens: int | None = None
    max_sampled_tokens: int | None = None
    max_tool_calls: int | None = None
    max_turn_tokens: int | None = None
    rollout_timeout_seconds: float | None = None
    sampling_turn_timeout_seconds: float | None = None


class LimitedEnvs(FakeEnvGroupBuilder):
    """Every env carries ``rollout_limits``, as 0.6.1's envs built from a ``RolloutConfig`` do."""

    limits = FakeRolloutLimits()

    async def make_envs(self) -> Sequence[Env]:
        envs = await super().make_envs()
        for env in envs:
            env.rollout_limits = self.limits  # type: ignore[attr-defined]
        return envs


class LimitedDataset(FakeDataset):
    def __init__(self, limits: FakeRolloutLimits, num_batches: int, batch_size: int) -> None:
        super().__init__(num_batches=num_batches, batch_size=batch_size)
        self.limits = limits

    def get_batch(self, index: int) -> list[FakeEnvGroupBuilder]:
        builders: list[FakeEnvGroupBuilder] = []
        for g in range(self.batch_sizes[index]):
            builder = LimitedEnvs((index, g), self.spec, self.log)
            builder.limits = self.limits
            builders.append(builder)
        return builders


@pytest.mark.parametrize(
    "strategy", [FailFast(), RetryOnFailure(max_retries=2), MinViableGroup()], ids=lambda s: type(s).__name__
)
async def test_an_env_whose_rollout_limits_set_a_limit_stops_the_run_under_every_strategy(
    log_path: Path, strategy: ErrorStrategy, autojump_clock: MockClock
) -> None:
    config = make_config(log_path, "sync", rollout_error_tolerance=strategy)
    limits = FakeRolloutLimits(max_turns=2, max_sampled_tokens=64, rollout_timeout_seconds=30.0)
    with pytest.RaisesGroup(
        pytest.RaisesExc(
            ConfigError,
            match=r"^rollout_limits: FakeEnv sets max_sampled_tokens=64, rollout_timeout_seconds=30\.0, which",
        ),
        flatten_subgroups=True,
    ) as caught:
        await run_fake(config, LimitedDataset(limits, num_batches=3, batch_size=2))
    assert stops_the_run(caught.value)
    assert [r for r in read_jsonl(log_path / "metrics.jsonl") if "progress/groups" in r] == []


async def test_rollout_limits_with_every_field_none_change_nothing(log_path: Path, autojump_clock: MockClock) -> None:
    config = make_config(log_path, "sync")
    result = await run_fake(config, LimitedDataset(FakeRolloutLimits(), num_batches=3, batch_size=2))
    assert result.final_step == 3 and result.trained_groups == 6


async def test_an_env_without_set_max_tool_calls_refuses_a_tool_call_limit(
    log_path: Path, autojump_clock: MockClock
) -> None:
    config = make_config(log_path, "sync")
    with pytest.RaisesGroup(
        pytest.RaisesExc(ConfigError, match=r"^rollout_limits: FakeEnv sets max_tool_calls=3 but has no set_max"),
        flatten_subgroups=True,
    ):
        await run_fake(config, LimitedDataset(FakeRolloutLimits(max_tool_calls=3), num_batches=2, batch_size=2))


class EndlessEnv(FakeEnv):
    """Never ends its episode by itself; counts the tool-call limit it is handed."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.handed: list[int] = []

    def set_max_tool_calls(self, limit: int) -> None:
        self.handed.append(limit)

    async def step(self, action: list[int], extra: Any = None) -> Any:
        result = await super().step(action)
        result.episode_done = False
        result.metrics["stop/completed"] = 1.0  # an env-reported stop that the runner's stop replaces
        return result


async def test_max_turns_and_max_tool_calls_are_enforced_as_0_6_1s_runner_does(autojump_clock: MockClock) -> None:
    env = EndlessEnv((0, 0), 1, FakeEnvSpec(), 0, [])
    env.rollout_limits = FakeRolloutLimits(max_turns=3, max_tool_calls=2)  # type: ignore[attr-defined]
    with trio.fail_after(10):
        trajectory = await do_single_rollout(policies(FakeBackend())(0, 0), env)
    assert len(trajectory.transitions) == 3 and trajectory.stop_reason == "max_turns"
    assert [t.episode_done for t in trajectory.transitions] == [False, False, True]
    assert [k for k in trajectory.transitions[-1].metrics if k.startswith("stop/")] == ["stop/max_turns"]
    assert env.handed == [2]
