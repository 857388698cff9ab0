"""Fake envs, groups and datasets whose rewards depend on the sampled tokens, told where to fail or hang."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio

from .. import _tinker_compat as compat
from ..types import (
    ActionExtra,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    RLDataset,
    StepResult,
    StopCondition,
    Trajectory,
)

FailPoint = str
"""Where a fake env fails: ``make_envs``, ``step``, ``compute_group_rewards`` or ``never``."""


@dataclass
class FakeEnvSpec:
    """How the fake envs of a dataset behave.

    Attributes:
        group_size: envs per group.
        turns: steps per episode; observations extend the previous turn's
            sequence, so multi-turn data merges into one Datum.
        step_latency: virtual seconds each ``env.step`` takes.
        fail_at: ``(batch, group)`` -> where that group fails.
        fail_attempts: how many rollout attempts of a failing group fail before
            one succeeds (``None``: all of them).
        hang_at: ``(batch, group)`` whose ``step`` never returns on the first attempt.
        error: the exception a failing fake env raises.
        constant_reward_groups: groups ``(batch, group)`` whose every env gets reward 1.0.
        failure_times: when each injected failure was raised (``trio.current_time()``).
    """

    group_size: int = 4
    turns: int = 1
    step_latency: float = 0.0
    fail_at: dict[tuple[int, int], FailPoint] = field(default_factory=dict)
    fail_attempts: int | None = None
    hang_at: set[tuple[int, int]] = field(default_factory=set)
    error: type[Exception] = RuntimeError
    constant_reward_groups: set[tuple[int, int]] = field(default_factory=set)
    failure_times: list[float] = field(default_factory=list)

    def fail(self, message: str) -> Exception:
        """Record the failure time and return the exception to raise."""
        self.failure_times.append(trio.current_time())
        return self.error(message)


class FakeEnv(Env):
    """Rewards the fraction of even tokens in each action; ``turns`` steps long."""

    def __init__(self, key: tuple[int, int], index: int, spec: FakeEnvSpec, attempt: int, log: list[str]) -> None:
        self.key = key
        self.index = index
        self.spec = spec
        self.attempt = attempt
        self.turn = 0
        self.tokens = [1 + key[0], 2 + key[1], 3 + index]
        self.log = log

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return compat.model_input_from_ints(list(self.tokens)), [0]

    async def step(self, action: list[int], *, extra: ActionExtra | None = None) -> StepResult:
        spec = self.spec
        failing = spec.fail_attempts is None or self.attempt < spec.fail_attempts
        if spec.fail_at.get(self.key) == "step" and failing and self.index == 0:
            raise spec.fail(f"fake env {self.key} failed in step")
        if self.key in spec.hang_at and self.attempt == 0 and self.index == 0:
            self.log.append(f"hang {self.key}")
            await trio.sleep_forever()
        if spec.step_latency:
            await trio.sleep(spec.step_latency)
        self.turn += 1
        self.tokens = self.tokens + list(action) + [5]
        reward = sum(1 for t in action if t % 2 == 0) / max(1, len(action))
        if self.key in spec.constant_reward_groups:
            reward = 1.0
        done = self.turn >= spec.turns
        return StepResult(
            reward=reward / spec.turns,
            episode_done=done,
            next_observation=compat.model_input_from_ints(list(self.tokens)),
            next_stop_condition=[0],
            metrics={"even_frac": reward},
        )


class FakeEnvGroupBuilder(EnvGroupBuilder):
    """A group of :class:`FakeEnv`; logs what happens to it in ``log``."""

    def __init__(self, key: tuple[int, int], spec: FakeEnvSpec, log: list[str], tags: Sequence[str] = ()) -> None:
        self.key = key
        self.spec = spec
        self.log = log
        self.tags = list(tags)
        self.attempts = 0
        self.retries = 0

    async def make_envs(self) -> Sequence[Env]:
        attempt = self.attempts
        self.attempts += 1
        failing = self.spec.fail_attempts is None or attempt < self.spec.fail_attempts
        if self.spec.fail_at.get(self.key) == "make_envs" and failing:
            raise self.spec.fail(f"fake group {self.key} failed in make_envs")
        self.log.append(f"make_envs {self.key}")
        return [FakeEnv(self.key, i, self.spec, attempt, self.log) for i in range(self.spec.group_size)]

    async def make_env(self, index: int) -> Env:
        self.retries += 1
        self.log.append(f"make_env {self.key} {index}")
        return FakeEnv(self.key, index, self.spec, self.attempts + self.retries, self.log)

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        if self.spec.fail_at.get(self.key) == "compute_group_rewards":
            raise self.spec.fail(f"fake group {self.key} failed in compute_group_rewards")
        return [(0.0, {"group_size": len(trajectory_group)}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return self.tags

    async def cleanup(self) -> None:
        self.log.append(f"cleanup {self.key}")


class FakeDataset(RLDataset):
    """``num_batches`` batches of ``batch_size`` fake groups; the last may be smaller.

    Args:
        batch_sizes: every batch's size, instead of ``num_batches``/``batch_size``/``last_batch_size``.

    Attributes:
        log: what the fake envs did (``make_envs``, ``cleanup``, ``hang``).
    """

    def __init__(
        self,
        num_batches: int = 0,
        batch_size: int = 0,
        spec: FakeEnvSpec | None = None,
        *,
        last_batch_size: int | None = None,
        batch_sizes: Sequence[int] | None = None,
        tags: Callable[[int, int], Sequence[str]] = lambda b, g: ("even" if g % 2 == 0 else "odd",),
    ) -> None:
        if batch_sizes is None:
            last = batch_size if last_batch_size is None else last_batch_size
            batch_sizes = [batch_size] * max(0, num_batches - 1) + [last] * min(1, num_batches)
        self.batch_sizes = list(batch_sizes)
        self.spec = spec or FakeEnvSpec()
        self.tags = tags
        self.log: list[str] = []
        self._builders: dict[tuple[int, int], FakeEnvGroupBuilder] = {}
        self.batches_built: list[int] = []
        """The index of every ``get_batch`` call, in order."""

    def __len__(self) -> int:
        return len(self.batch_sizes)

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self.batch_sizes):
            raise IndexError(f"batch {index} out of range for {len(self.batch_sizes)} batches")
        self.batches_built.append(index)
        # The same builder object each time, so tests can inspect its attempts.
        return [
            self._builders.setdefault(
                (index, g), FakeEnvGroupBuilder((index, g), self.spec, self.log, self.tags(index, g))
            )
            for g in range(self.batch_sizes[index])
        ]

    @property
    def total_groups(self) -> int:
        """Groups in the whole dataset."""
        return sum(self.batch_sizes)
