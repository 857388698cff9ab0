"""The RL vocabulary: environments, transitions, trajectories and datasets.

These mirror tinker-cookbook 0.6.1's ``rl/types.py`` (and the
``TokensWithLogprobs`` / ``StopCondition`` of its ``completers.py``) name for
name, field for field, with the same defaults and method signatures, so an
environment module written for the cookbook ports to trio_rl by changing its
``tinker_cookbook.rl.types`` imports to ``trio_rl.types`` (tests/cookbook checks
that on the cookbook's own modules). Where trio_rl records more (the richer
:class:`RolloutError`, :meth:`EnvGroupBuilder.make_env`), it adds fields and
methods with defaults; it renames nothing.

Observations are :class:`tinker.types.ModelInput`; actions are lists of token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeAlias, TypedDict

from tinker import types as tinker_types

Action: TypeAlias = list[int]
Observation: TypeAlias = tinker_types.ModelInput
Logprobs: TypeAlias = list[float]
Metrics: TypeAlias = dict[str, float | int]
Logs: TypeAlias = dict[str, str | int | float]
"""Diagnostic values for display; unlike :data:`Metrics` they are never aggregated."""
StopCondition: TypeAlias = list[str] | list[int]
"""Stop sequences for the next action: strings, or token ids (each a one-token stop)."""


class StopReason(StrEnum):
    """Why a trajectory ended, as the cookbook names it.

    An env that knows records it as the one-hot metric ``stop/<reason>`` on its
    final transition; the rollout copies it onto :attr:`Trajectory.stop_reason`.
    """

    COMPLETED = "completed"
    TOOL_STOPPED = "tool_stopped"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    MAX_SAMPLED_TOKENS = "max_sampled_tokens"
    MAX_TOOL_CALLS = "max_tool_calls"
    CONTEXT_OVERFLOW = "context_overflow"
    PARSE_ERROR = "parse_error"
    ROLLOUT_TIMEOUT = "rollout_timeout"


STOP_METRIC_PREFIX = "stop/"
"""Prefix of the one-hot stop-reason metrics (``stop/<reason>``)."""

PARSE_ERROR_MASKED_METRIC_KEY = "parse_error_masked"
"""One-hot metric an env sets on a transition whose malformed action should not be trained on."""


def stop_reason_from_metrics(metrics: Metrics) -> str | None:
    """The ``<reason>`` of the first ``stop/<reason>`` key in ``metrics``, if any."""
    for key in metrics:
        if key.startswith(STOP_METRIC_PREFIX):
            return key.removeprefix(STOP_METRIC_PREFIX)
    return None


@dataclass(frozen=True)
class InitialObservationOverflow:
    """What :meth:`Env.initial_observation` returns when the prompt alone is over budget.

    The rollout then ends at once without sampling: its trajectory holds one
    synthetic transition (empty observation and action, ``episode_done=True``)
    carrying ``reward``, ``metrics`` and ``logs``. It produces no training
    tokens, but its reward still counts in the group's mean, and the group is
    kept, as in the cookbook. The pipeline counts such rollouts in the metric
    ``rollouts/initial_overflow``.
    """

    reward: float
    metrics: Metrics = field(default_factory=dict[str, float | int])
    logs: Logs = field(default_factory=dict[str, str | int | float])


class ActionExtra(TypedDict, total=False):
    """What the rollout passes to :meth:`Env.step` beside the action.

    Attributes:
        stop_reason: the sampler's ``"stop"`` (a stop sequence was hit) or
            ``"length"`` (``max_tokens`` was reached).
    """

    stop_reason: tinker_types.StopReason


@dataclass
class TokensWithLogprobs:
    """Sampled tokens and, when the sampler returned them, their logprobs.

    Attributes:
        stop_reason: why sampling stopped (``"stop"`` or ``"length"``).
        sequence_id: the sampler's id for the sequence, where it has one.
        prompt_cache_hit_tokens: prompt tokens the sampler served from its cache.
        token_versions: the weights version that produced each token, where the
            sampler says (an in-flight sampler of a local or fake backend); ``None``
            where it does not.
    """

    tokens: list[int]
    maybe_logprobs: list[float] | None
    stop_reason: tinker_types.StopReason = "stop"
    sequence_id: str | None = None
    prompt_cache_hit_tokens: int = 0
    token_versions: list[int] | None = None

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
    metrics: Metrics = field(default_factory=dict[str, float | int])
    logs: Logs = field(default_factory=dict[str, str | int | float])


@dataclass
class Transition:
    """One turn: the observation, the sampled action, and what the env said about it."""

    ob: Observation
    ac: TokensWithLogprobs
    reward: float
    episode_done: bool
    metrics: Metrics = field(default_factory=dict[str, float | int])
    logs: Logs = field(default_factory=dict[str, str | int | float])


class Env:
    """A stateful environment for one agent and one episode; discard it afterwards."""

    async def initial_observation(self) -> tuple[Observation, StopCondition] | InitialObservationOverflow:
        """Return the first observation and the stop condition for the first action.

        An env with a token budget may return :class:`InitialObservationOverflow`
        instead, which ends the rollout at once without sampling.
        """
        raise NotImplementedError

    async def step(self, action: Action, *, extra: ActionExtra | None = None) -> StepResult:
        """Apply ``action`` and return the reward and the next observation.

        ``extra`` carries the sampler's stop reason. Envs written before it
        existed may declare ``step(self, action)``; the rollout then omits it.
        """
        raise NotImplementedError


@dataclass(frozen=True)
class Trajectory:
    """The transitions of one episode and the observation it ended on.

    Attributes:
        stop_reason: why the episode ended, copied from the final transition's
            ``stop/<reason>`` metric (None when the env reported none).
    """

    transitions: list[Transition]
    final_ob: Observation
    stop_reason: str | None = None


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
    rollout_errors: list[RolloutError] = field(default_factory=list["RolloutError"])

    def get_total_rewards(self) -> list[float]:
        """Per trajectory, the sum of its step rewards plus its final group reward."""
        if len(self.trajectories_G) != len(self.final_rewards_G):
            raise ValueError(f"{len(self.trajectories_G)} trajectories but {len(self.final_rewards_G)} final rewards")
        return [
            sum(t.reward for t in traj.transitions) + final
            for traj, final in zip(self.trajectories_G, self.final_rewards_G, strict=True)
        ]


@dataclass(frozen=True)
class RolloutError:
    """One failed rollout attempt, kept on its group for the metrics.

    ``error_type`` and ``error_message`` are the cookbook's fields (and its
    constructor: ``RolloutError(error_type=..., error_message=...)``); trio_rl
    also keeps which env slot and attempt failed and the exception itself.
    Build one from an exception with :meth:`from_exception`.

    Attributes:
        error_type: the exception's class name.
        error_message: ``str(exception)``.
        env_index: the env slot in its group (-1 when unknown).
        attempt: 0 for the first attempt, then 1, 2, ... for retries.
        error: the exception, when it is at hand.
        timed_out: whether the attempt ran past ``per_rollout_timeout``.
    """

    error_type: str
    error_message: str
    env_index: int = -1
    attempt: int = 0
    error: BaseException | None = None
    timed_out: bool = False

    @classmethod
    def from_exception(
        cls, error: BaseException, *, env_index: int, attempt: int, timed_out: bool = False
    ) -> RolloutError:
        """Record ``error`` as the failure of attempt ``attempt`` of env slot ``env_index``."""
        return cls(type(error).__name__, str(error), env_index, attempt, error, timed_out)


class RLDataset:
    """A dataset of batches of env group builders."""

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        """Return the builders of batch ``index``."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class RLDatasetBuilder:
    """Builds the training dataset and an optional test dataset, once, at the start.

    A ``chz`` class when chz is installed, as in the cookbook (whose builders are
    ``@chz.chz`` subclasses of it).
    """

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        """Return ``(train_dataset, test_dataset_or_None)``."""
        raise NotImplementedError


def _as_chz_class(cls: type[Any]) -> type[Any]:
    # chz wants a chz base under a chz subclass. trio_rl does not depend on chz;
    # wherever cookbook modules run it is installed, and then the base is one.
    try:
        import chz  # pyright: ignore[reportMissingImports]  (optional: present where cookbook code runs)
    except ImportError:
        return cls
    # Through a typed name: chz is typed where it is installed and Any where it is not.
    chz_class: type[Any] = chz.chz(cls)
    return chz_class


RLDatasetBuilder = _as_chz_class(RLDatasetBuilder)  # type: ignore[misc]
