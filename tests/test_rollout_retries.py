"""Retries make the same backend calls whatever Trio's task order: the same envs rebuilt, the same samples requested.

A group's failures at one instant are answered together, and when the group
has failed, its cancel lands before any of its slots acts on its answer. So
identical runs under a ``MockClock`` call ``make_env`` and ``sample`` the same
way, not only write the same files. Trio's task order is drawn from a seed
by the ``trio_task_order_from_seed`` fixture (``tests/conftest.py``), as in
``tests/test_pipeline_properties.py``.

``TRIO_RL_HYPOTHESIS_EXAMPLES`` sets how many examples the property runs.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import TaskOrder
from trio_rl import Config, MinViableGroup, RetryOnFailure, RLTestSetEvaluator, train
from trio_rl import _tinker_compat as compat
from trio_rl.rl.rollouts import ErrorStrategy
from trio_rl.testing import FakeBackend
from trio_rl.types import Env, EnvGroupBuilder, Metrics, Observation, RLDataset, StepResult, StopCondition, Trajectory

VIRTUAL_DEADLINE_S = 100_000.0
EXAMPLES = int(os.environ.get("TRIO_RL_HYPOTHESIS_EXAMPLES", "150")) // 3 or 1

Key = tuple[int, int]


@dataclass
class Flakiness:
    """Which slots of which groups fail, on how many attempts, and the calls made to build envs."""

    group_size: int
    failing: dict[Key, frozenset[int]]
    """(batch, group) -> the env slots whose rollouts fail in ``step``."""
    failed_attempts: int = 1
    """How many attempts of a failing slot fail before one succeeds."""
    turns: int = 1
    checkpoint_in_step: bool = False
    """Whether ``step`` passes through a Trio checkpoint (as an env doing I/O would)."""
    made: list[tuple[str, Key, int]] = field(default_factory=list)


class FlakyEnv(Env):
    def __init__(self, key: Key, index: int, attempt: int, flaky: Flakiness) -> None:
        self.key, self.index, self.attempt, self.flaky = key, index, attempt, flaky
        self.tokens = [1 + key[0], 2 + key[1], 3 + index]
        self.turn = 0

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return compat.model_input_from_ints(list(self.tokens)), [0]

    async def step(self, action: list[int], *, extra: Any = None) -> StepResult:
        flaky = self.flaky
        if flaky.checkpoint_in_step:
            await trio.lowlevel.checkpoint()
        if self.index in flaky.failing.get(self.key, ()) and self.attempt < flaky.failed_attempts:
            raise RuntimeError(f"flaky env {self.key} slot {self.index} attempt {self.attempt}")
        self.turn += 1
        self.tokens = [*self.tokens, *action, 5]
        done = self.turn >= flaky.turns
        reward = sum(1 for t in action if t % 2 == 0) / max(1, len(action))
        return StepResult(reward, done, compat.model_input_from_ints(list(self.tokens)), [0], {})


class FlakyGroup(EnvGroupBuilder):
    def __init__(self, key: Key, flaky: Flakiness) -> None:
        self.key, self.flaky = key, flaky
        self.attempts: Counter[int] = Counter()

    async def make_envs(self) -> Sequence[Env]:
        self.flaky.made.append(("make_envs", self.key, -1))
        return [FlakyEnv(self.key, i, 0, self.flaky) for i in range(self.flaky.group_size)]

    async def make_env(self, index: int) -> Env:
        self.flaky.made.append(("make_env", self.key, index))
        self.attempts[index] += 1
        return FlakyEnv(self.key, index, self.attempts[index], self.flaky)

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectory_group]


class FlakyDataset(RLDataset):
    def __init__(self, num_batches: int, batch_size: int, flaky: Flakiness) -> None:
        self.num_batches, self.batch_size, self.flaky = num_batches, batch_size, flaky

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [FlakyGroup((index, g), self.flaky) for g in range(self.batch_size)]


def backend_calls(
    task_order: TaskOrder,
    flaky: Flakiness,
    strategy: ErrorStrategy,
    scheduling_seed: int,
    *,
    num_batches: int = 3,
    evaluate: bool = False,
) -> tuple[list[Any], list[Any]]:
    """One run of 4 groups per batch under ``scheduling_seed``: its env builds and its sample requests, sorted."""
    flaky.made.clear()
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    # The held-out set fails as the training set does, under the same strategy.
    evaluators = [RLTestSetEvaluator(FlakyDataset(1, 4, flaky), max_tokens=8, strategy=strategy)] if evaluate else []

    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            config = Config(log_path=Path(tmp) / "run", eval_every=1, save_every=0, rollout_error_tolerance=strategy)
            with trio.fail_after(VIRTUAL_DEADLINE_S):
                async with backend:
                    await train(
                        config, dataset=FlakyDataset(num_batches, 4, flaky), backend=backend, evaluators=evaluators
                    )

    with task_order(scheduling_seed):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    samples = sorted((c.version, c.detail["seed"], c.detail["prompt_len"]) for c in backend.calls_of("sample"))
    return sorted(flaky.made), samples


def test_a_failed_group_cancels_its_retries_before_any_is_made(trio_task_order_from_seed: TaskOrder) -> None:
    # Two groups whose every slot fails at the same instant, with one retry for the group:
    # slot 0 is answered "retry", the others "no retry", so the group has failed.
    flaky = Flakiness(group_size=4, failing={(0, 1): frozenset(range(4)), (1, 2): frozenset(range(4))})
    order = trio_task_order_from_seed
    outcomes = {repr(backend_calls(order, flaky, RetryOnFailure(max_retries=1), seed)) for seed in range(8)}
    assert len(outcomes) == 1
    made, _ = backend_calls(order, flaky, RetryOnFailure(max_retries=1), 0)
    assert [m for m in made if m[0] == "make_env"] == []  # the group failed: no env was rebuilt


# The fixture is function-scoped but shared safely by the examples: each run
# seeds Trio's generator inside ``with task_order(seed):`` and puts it back.
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    group_size=st.integers(2, 5),
    failing=st.dictionaries(
        st.tuples(st.integers(0, 2), st.integers(0, 3)),
        st.frozensets(st.integers(0, 4), min_size=1),
        min_size=1,
        max_size=4,
    ),
    failed_attempts=st.integers(1, 3),
    turns=st.integers(1, 3),
    checkpoint_in_step=st.booleans(),
    strategy=st.sampled_from(["retry", "min_viable"]),
    max_retries=st.integers(0, 3),
    scheduling_seeds=st.lists(st.integers(0, 2**32 - 1), min_size=2, max_size=2, unique=True),
)
def test_identical_runs_make_identical_backend_calls_whatever_fails_and_whatever_the_task_order(
    trio_task_order_from_seed: TaskOrder,
    group_size: int,
    failing: dict[Key, frozenset[int]],
    failed_attempts: int,
    turns: int,
    checkpoint_in_step: bool,
    strategy: str,
    max_retries: int,
    scheduling_seeds: list[int],
) -> None:
    flaky = Flakiness(group_size, failing, failed_attempts, turns, checkpoint_in_step)
    chosen: ErrorStrategy = (
        RetryOnFailure(max_retries=max_retries) if strategy == "retry" else MinViableGroup(1, max_retries=max_retries)
    )
    first, second = (
        backend_calls(trio_task_order_from_seed, flaky, chosen, seed, evaluate=True) for seed in scheduling_seeds
    )
    assert first == second
