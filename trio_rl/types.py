"""The RL vocabulary: environments, transitions, trajectories and datasets.

These mirror tinker-cookbook's ``rl/types.py`` name for name, so an environment
written for the cookbook ports to trio_rl by changing its imports. Observations
are :class:`tinker.types.ModelInput`; actions are lists of token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from tinker import types as tinker_types

Action: TypeAlias = list[int]
Observation: TypeAlias = tinker_types.ModelInput
Logprobs: TypeAlias = list[float]
Metrics: TypeAlias = dict[str, float | int]
StopCondition: TypeAlias = list[str] | list[int]
"""Stop sequences for the next action: strings, or token ids (each a one-token stop)."""


@dataclass
class TokensWithLogprobs:
    """Sampled tokens and, when the sampler returned them, their logprobs."""

    tokens: list[int]
    maybe_logprobs: list[float] | None
    sequence_id: str | None = None
    """The sampler's id for the sequence (tinker SDKs after 0.24), carried into a Datum's provenance."""

    @property
    def logprobs(self) -> list[float]:
        """The logprobs; raises ``ValueError`` if the sampler returned none."""
        if self.maybe_logprobs is None:
            raise ValueError("these tokens were sampled without logprobs")
        return self.maybe_logprobs


@dataclass
class StepResult:
    """What :meth:`Env.step` returns."""

    reward: float
    episode_done: bool
    next_observation: Observation
    next_stop_condition: StopCondition
    metrics: Metrics = field(default_factory=dict)


@dataclass
class Transition:
    """One turn: the observation, the sampled action, and what the env said about it."""

    ob: Observation
    ac: TokensWithLogprobs
    reward: float
    episode_done: bool
    metrics: Metrics = field(default_factory=dict)


class Env:
    """A stateful environment for one agent and one episode; discard it afterwards."""

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        """Return the first observation and the stop condition for the first action."""
        raise NotImplementedError

    async def step(self, action: Action) -> StepResult:
        """Apply ``action`` and return the reward and the next observation."""
        raise NotImplementedError


@dataclass(frozen=True)
class Trajectory:
    """The transitions of one episode and the observation it ended on."""

    transitions: list[Transition]
    final_ob: Observation


class EnvGroupBuilder:
    """Builds a group of envs whose rewards are centred together (GRPO-style).

    ``cleanup`` is always awaited once the group's rollouts are over, whether they
    succeeded, failed or were cancelled; it runs shielded with a time limit.
    """

    async def make_envs(self) -> Sequence[Env]:
        """Create the envs of one group."""
        raise NotImplementedError

    async def make_env(self, index: int) -> Env:
        """Optionally, build one fresh env for slot ``index``, to retry a failed rollout.

        The retrying error strategies use it when a builder overrides it; otherwise
        they call :meth:`make_envs` and use one env of the new group (as
        tinker-cookbook does, whose builders have no ``make_env``).
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement make_env(index)")

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        """Return a final reward and metrics per trajectory; the default is zero."""
        return [(0.0, {}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        """Tags under which this group's metrics are also reported (``env/<tag>/...``)."""
        return []

    async def cleanup(self) -> None:
        """Release whatever :meth:`make_envs` acquired."""


@dataclass
class TrajectoryGroup:
    """The trajectories of one env group with their group rewards.

    ``rollout_errors`` records every failed rollout attempt of the group, so that an
    error strategy that tolerated failures still reports them.
    """

    trajectories_G: list[Trajectory]
    final_rewards_G: list[float]
    metrics_G: list[Metrics]
    rollout_errors: list[RolloutError] = field(default_factory=list)

    def get_total_rewards(self) -> list[float]:
        """Per trajectory, the sum of its step rewards plus its final group reward."""
        if len(self.trajectories_G) != len(self.final_rewards_G):
            raise ValueError(
                f"{len(self.trajectories_G)} trajectories but {len(self.final_rewards_G)} final rewards"
            )
        return [
            sum(t.reward for t in traj.transitions) + final
            for traj, final in zip(self.trajectories_G, self.final_rewards_G)
        ]


@dataclass(frozen=True)
class RolloutError:
    """One failed rollout attempt, kept on its group for the metrics."""

    env_index: int
    attempt: int
    error: BaseException
    timed_out: bool = False

    @property
    def error_type(self) -> str:
        """The exception's class name, as tinker-cookbook's ``RolloutError.error_type``."""
        return type(self.error).__name__

    @property
    def error_message(self) -> str:
        """``str`` of the exception, as tinker-cookbook's ``RolloutError.error_message``."""
        return str(self.error)


class RLDataset:
    """A dataset of batches of env group builders."""

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        """Return the builders of batch ``index``."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError
