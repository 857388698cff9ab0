"""Rollouts: one env, one group, and what to do when a rollout fails.

A rollout alternates sampling and ``env.step`` until the episode ends. A group
rollout runs one rollout per env of an :class:`EnvGroupBuilder` concurrently, then
asks the builder for group rewards. The error strategies decide what a failing
rollout does to its group; they are built from nurseries and cancel scopes, and
failures are captured with :mod:`outcome`:

- :class:`FailFast`: the first failure cancels the group and propagates.
- :class:`RetryOnFailure`: failed rollouts are retried on fresh envs from one
  budget for the whole group; a failure once it is spent fails the group.
- :class:`MinViableGroup`: failures are retried only while fewer than the floor
  (default ``ceil(0.75 * G)``) have succeeded; the group survives with whatever
  succeeded as long as the floor is met.

These are tinker-cookbook 0.6.1's strategies with its names, defaults and
meanings (``Config.rollout_error_tolerance``). A group that fails under a
retrying strategy is skipped and counted by the run; under ``FailFast`` the run
ends. Every failed attempt is recorded as a :class:`RolloutError` on its group.

Every coroutine method of a user object (env, builder) is called through
:func:`trio_rl.asyncio_bridge.call_user`, so asyncio-flavoured envs (the
cookbook's) run on the run's asyncio loop and Trio ones run natively.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Protocol

import outcome
import trio
from tinker import types as tinker_types

from .. import _tinker_compat as compat
from ..asyncio_bridge import call_user, current_runner
from ..backends.protocol import SamplingClient, token_versions
from ..base.determinism import derive_seed, settle
from ..errors import EmptyGroupError, GroupFailedError, UnenforcedLimitsError
from ..observe.spans import on_free_lane, recording_spans, span
from ..observe.timed_calls import TimedPolicy, TimedUserCalls, UserCalls
from ..types import (
    STOP_METRIC_PREFIX,
    ActionExtra,
    Env,
    EnvGroupBuilder,
    InitialObservationOverflow,
    Metrics,
    Observation,
    RolloutError,
    StopCondition,
    StopReason,
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
    stop_reason_from_metrics,
)
from .termination import TerminationRewardPolicy, grade_group

CLEANUP_TIMEOUT_S = 30.0
"""How long ``EnvGroupBuilder.cleanup`` may take; it runs shielded, so it needs a bound."""


class TokenPolicy(Protocol):
    """Chooses the next action for an observation."""

    async def __call__(self, ob: Observation, stop: StopCondition) -> TokensWithLogprobs: ...


class ParamsPerCall:
    """Builds, per sampling call, a copy of one ``SamplingParams`` with that call's ``stop`` and ``seed``.

    Build it once and share it: it reads the params' fields once, and each copy
    is then made in one step. ``params.model_copy(update=...)`` copies the dict,
    the set of fields and the private state and then grows them, which came to a
    kilobyte per rollout while thousands wait on the sampler. Like ``model_copy``,
    it does not validate ``stop`` again.
    """

    def __init__(self, params: tinker_types.SamplingParams) -> None:
        self._build = compat.unvalidated_builder(type(params))
        self._values = dict(params)
        self._fields_set = params.model_fields_set | {"stop", "seed"}

    def __call__(self, stop: StopCondition, seed: int) -> tinker_types.SamplingParams:
        """The params for one call: these fields, with ``stop`` and ``seed`` replaced."""
        return self._build({**self._values, "stop": stop, "seed": seed}, self._fields_set)  # type: ignore[no-any-return]


class SamplingPolicy:
    """A policy that samples one completion per turn from a sampling client.

    Each turn's sampling seed derives from ``seed`` and the turn number, so a
    rollout's randomness depends only on its identity, not on scheduling.
    ``sampling_params`` may also be a :class:`ParamsPerCall` built once from
    them, which the pipeline shares across all its policies.
    """

    def __init__(
        self, client: SamplingClient, sampling_params: tinker_types.SamplingParams | ParamsPerCall, seed: int
    ) -> None:
        self._client = client
        self._params = sampling_params if isinstance(sampling_params, ParamsPerCall) else ParamsPerCall(sampling_params)
        self._seed = seed
        self._turn = 0

    async def __call__(self, ob: Observation, stop: StopCondition) -> TokensWithLogprobs:
        params = self._params(stop, derive_seed(self._seed, self._turn))
        self._turn += 1
        response = await self._client.sample(ob, 1, params)
        sequence = response.sequences[0]
        return TokensWithLogprobs(
            tokens=list(sequence.tokens),
            maybe_logprobs=sequence.logprobs,
            stop_reason=sequence.stop_reason,
            sequence_id=getattr(sequence, "sequence_id", None),
            # Older SDKs' responses have no such field; the cookbook reads it the same way.
            prompt_cache_hit_tokens=getattr(response, "prompt_cache_hit_tokens", None) or 0,
            token_versions=token_versions(sequence),
        )


PolicyFactory = Callable[[int, int], TokenPolicy]
"""``(env_index, attempt) -> policy``: a fresh policy for each rollout attempt."""


@functools.cache
def _step_takes_extra(step: Callable[..., object]) -> bool:
    """Whether an ``Env.step`` implementation accepts ``extra=`` (cookbook envs do; older trio_rl envs may not)."""
    try:
        parameters = inspect.signature(step).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == "extra" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _overflow_trajectory(overflow: InitialObservationOverflow) -> Trajectory:
    """The trajectory of a rollout whose env returned ``overflow`` (read by field name)."""
    # As in the cookbook: one synthetic, empty transition carrying the overflow's
    # reward; it yields no training tokens but counts in the group's mean.
    empty = compat.model_input_from_ints([])
    transition = Transition(
        ob=empty,
        ac=TokensWithLogprobs(tokens=[], maybe_logprobs=[]),
        reward=overflow.reward,
        episode_done=True,
        metrics=dict(getattr(overflow, "metrics", {})),
        logs=dict(getattr(overflow, "logs", {})),
    )
    return Trajectory([transition], final_ob=empty, stop_reason=stop_reason_from_metrics(transition.metrics))


async def do_single_rollout(policy: TokenPolicy, env: Env) -> Trajectory:
    """Run one episode of ``env`` under ``policy``.

    ``step`` gets the sampler's stop reason in ``extra`` (when it accepts
    ``extra``); an env returning :class:`InitialObservationOverflow` ends at once
    without sampling; the final transition's ``stop/<reason>`` metric becomes
    :attr:`Trajectory.stop_reason`.

    An env that advertises tinker-cookbook 0.6.1's ``rollout_limits`` gets two of them as
    0.6.1's runner enforces them: ``max_turns`` ends the episode before the turn past it
    (``stop/max_turns`` on the last transition, nothing graded), and ``max_tool_calls`` is
    handed to the env's ``set_max_tool_calls``. The others are refused by :func:`group_envs`.
    """
    into: list[Trajectory | None] = [None]
    await _rollout_task()(into, 0, policy, env)
    trajectory = into[0]
    assert trajectory is not None
    return trajectory


def _rollout_task() -> Callable[[list[Trajectory | None], int, TokenPolicy, Env], Awaitable[None]]:
    """:func:`_roll_out_into`, timed where the run records spans; chosen once per group, not per call."""
    return _timed_roll_out_into if recording_spans() else _roll_out_into


async def _timed_roll_out_into(into: list[Trajectory | None], index: int, policy: TokenPolicy, env: Env) -> None:
    """:func:`_roll_out_into` as a ``rollout`` span, its samples and env calls spans inside it."""
    # A lane of its own in a trace: the group's rollouts run at once, each on one.
    with on_free_lane("rollout"), span("rollout"):
        await _roll_out_into(into, index, TimedPolicy(policy), env, TimedUserCalls(current_runner()))


async def _roll_out_into(
    into: list[Trajectory | None], index: int, policy: TokenPolicy, env: Env, runner: UserCalls | None = None
) -> None:
    """:func:`do_single_rollout`, leaving the trajectory at ``into[index]``; env calls go through ``runner``.

    So a group's rollouts can be tasks of their own: a wrapper that stored what
    ``do_single_rollout`` returns would be one more frame for every rollout,
    held all the while it waits on the sampler.
    """
    runner = runner if runner is not None else current_runner()
    # 0.6.1's runner-side limits that an env advertises (refuse_rollout_limits refused the rest).
    limits = getattr(env, "rollout_limits", None)
    max_turns: int | None = getattr(limits, "max_turns", None)
    max_tool_calls: int | None = getattr(limits, "max_tool_calls", None)
    if max_tool_calls is not None:
        env.set_max_tool_calls(max_tool_calls)  # type: ignore[attr-defined]
    initial = await runner.call(env.initial_observation)  # waits on: env_initial_observation
    # Not a (observation, stop) pair: an overflow, ours or the cookbook's own class.
    if not isinstance(initial, tuple):
        if not hasattr(initial, "reward"):
            raise TypeError(
                f"{type(env).__name__}.initial_observation returned {type(initial).__name__}; "
                "expected (observation, stop_condition) or InitialObservationOverflow"
            )
        into[index] = _overflow_trajectory(initial)
        return
    ob, stop = initial
    takes_extra = _step_takes_extra(type(env).step)
    step = runner.bind(env.step)
    transitions: list[Transition] = []
    while True:
        if max_turns is not None and len(transitions) >= max_turns:
            # The env did not end the episode, so it graded nothing: as 0.6.1's runner stops.
            into[index] = _runner_stop(transitions, ob, StopReason.MAX_TURNS)
            return
        action = await policy(ob, stop)  # waits on: sample
        if takes_extra:
            result = await step(action.tokens, extra=ActionExtra(stop_reason=action.stop_reason))  # waits on: env_step
        else:
            result = await step(action.tokens)  # waits on: env_step
        # Results are read by field name: a cookbook env returns the cookbook's StepResult.
        transition = Transition(
            ob, action, result.reward, result.episode_done, result.metrics, getattr(result, "logs", {})
        )
        transitions.append(transition)
        if result.episode_done:
            into[index] = Trajectory(
                transitions=transitions,
                final_ob=result.next_observation,
                stop_reason=stop_reason_from_metrics(transition.metrics),
            )
            return
        ob, stop = result.next_observation, result.next_stop_condition


@dataclass(frozen=True)
class GroupRollout:
    """What an error strategy produced: surviving trajectories, their envs, and failures."""

    trajectories: list[Trajectory]
    envs: list[Env]
    errors: list[RolloutError] = field(default_factory=list[RolloutError])


class ErrorStrategy(Protocol):
    """Runs the rollouts of one group and decides what failures mean (tinker-cookbook's ``RolloutStrategy``)."""

    @property
    def catches_group_errors(self) -> bool:
        """Whether a group that fails (beyond tolerance, or in ``make_envs``/``compute_group_rewards``)
        is skipped and counted rather than ending the run."""
        ...

    async def run(self, builder: EnvGroupBuilder, envs: Sequence[Env], policy_for: PolicyFactory) -> GroupRollout:
        """Roll out every env; raise if the group cannot be used."""
        ...


@dataclass(frozen=True)
class FailFast:
    """The first failing rollout cancels its siblings and propagates unchanged: the run ends."""

    @property
    def catches_group_errors(self) -> bool:
        return False

    async def run(self, builder: EnvGroupBuilder, envs: Sequence[Env], policy_for: PolicyFactory) -> GroupRollout:
        trajectories: list[Trajectory | None] = [None] * len(envs)
        roll_out = _rollout_task()
        async with trio.open_nursery() as nursery:
            for index in range(1, len(envs)):
                nursery.start_soon(roll_out, trajectories, index, policy_for(index, 0), envs[index])
            if envs:
                # The first rollout runs in this task, which would otherwise only wait for it.
                await roll_out(trajectories, 0, policy_for(0, 0), envs[0])
        return GroupRollout(trajectories=[t for t in trajectories if t is not None], envs=list(envs))


@dataclass(frozen=True)
class RetryOnFailure:
    """Retry failed or timed-out rollouts on fresh envs, from one budget for the whole group.

    As in tinker-cookbook: once the budget is spent, the next failure cancels
    the group's other rollouts and fails the group, which the run then skips
    and counts (``rollout_errors/groups_skipped``); training goes on.

    A fresh env comes from ``builder.make_env(index)`` when the builder has one
    (one env built), otherwise from ``builder.make_envs()`` (a whole group
    built, the env of the same slot used), as the cookbook does.

    Attributes:
        max_retries: retries for the whole group, shared by all its envs.
        per_rollout_timeout: seconds one attempt may take (``None`` or ``0``: no limit).
    """

    max_retries: int = 3
    per_rollout_timeout: float | None = None

    def __post_init__(self) -> None:
        _check_retry_fields(self.max_retries, self.per_rollout_timeout)

    @property
    def catches_group_errors(self) -> bool:
        return True

    async def run(self, builder: EnvGroupBuilder, envs: Sequence[Env], policy_for: PolicyFactory) -> GroupRollout:
        rollout = await _run_with_retries(builder, envs, policy_for, self.max_retries, self.per_rollout_timeout, None)
        if len(rollout.trajectories) < len(envs):
            raise _group_failed(
                f"{len(rollout.errors)} rollout(s) failed; the group's budget of {self.max_retries} retries ran out",
                rollout,
            )
        return rollout


@dataclass(frozen=True)
class MinViableGroup:
    """Keep the group if at least ``min_successful`` rollouts succeed; retry only while below that floor.

    Attributes:
        min_successful: the floor below which the group fails (``None``: ``ceil(0.75 * G)``
            for a group of G envs, the cookbook's default).
        max_retries: retries for the whole group, spent only while the floor is unmet.
        per_rollout_timeout: seconds one attempt may take (``None`` or ``0``: no limit).
    """

    min_successful: int | None = None
    max_retries: int = 3
    per_rollout_timeout: float | None = None

    def __post_init__(self) -> None:
        _check_retry_fields(self.max_retries, self.per_rollout_timeout)
        if self.min_successful is not None and self.min_successful < 1:
            raise ValueError(f"MinViableGroup.min_successful must be >= 1 or None, got {self.min_successful}")

    @property
    def catches_group_errors(self) -> bool:
        return True

    def floor(self, group_size: int) -> int:
        """The minimum successful rollouts for a group of ``group_size`` envs."""
        return self.min_successful if self.min_successful is not None else math.ceil(0.75 * group_size)

    async def run(self, builder: EnvGroupBuilder, envs: Sequence[Env], policy_for: PolicyFactory) -> GroupRollout:
        floor = self.floor(len(envs))
        if len(envs) < floor:
            raise ValueError(f"MinViableGroup.min_successful={floor} exceeds the group size {len(envs)}")
        rollout = await _run_with_retries(builder, envs, policy_for, self.max_retries, self.per_rollout_timeout, floor)
        if len(rollout.trajectories) < floor:
            raise _group_failed(
                f"only {len(rollout.trajectories)} of {len(envs)} rollouts succeeded; MinViableGroup needs {floor}",
                rollout,
            )
        return rollout


def rollout_strategy_from_config(tolerance: bool | ErrorStrategy) -> ErrorStrategy:
    """Resolve ``Config.rollout_error_tolerance`` as the cookbook does.

    ``False``: :class:`FailFast`; ``True``: :class:`RetryOnFailure` with its
    defaults; a strategy: itself.
    """
    if tolerance is False:
        return FailFast()
    if tolerance is True:
        return RetryOnFailure()
    if not hasattr(tolerance, "run") or not hasattr(tolerance, "catches_group_errors"):
        raise TypeError(f"rollout_error_tolerance must be a bool or an error strategy, got {tolerance!r}")
    return tolerance


def default_rollout_strategy_for_model(base_model: str) -> ErrorStrategy:
    """The strategy of ``rollout_error_tolerance=None``, as tinker-cookbook 0.6.1 resolves it.

    ``thinkingmachines/Inkling`` models (a ``:suffix`` ignored) get :class:`MinViableGroup`,
    because their agentic rollouts meet infrastructure failures that should not end the
    run; every other model gets :class:`FailFast`.
    """
    if base_model.split(":", 1)[0].startswith("thinkingmachines/Inkling"):
        return MinViableGroup()
    return FailFast()


def builds_single_envs(builder: EnvGroupBuilder) -> bool:
    """Whether ``builder`` implements ``make_env(index)`` (cookbook builders do not)."""
    method = getattr(type(builder), "make_env", None)
    return callable(method) and method is not EnvGroupBuilder.make_env


async def _fresh_env(builder: EnvGroupBuilder, index: int) -> Env:
    if builds_single_envs(builder):
        return await call_user(builder.make_env, index)
    # The cookbook's path: build a group, use one env of it; the builder's
    # cleanup releases the rest with the group.
    group = await call_user(builder.make_envs)
    if not group:
        raise EmptyGroupError(f"{type(builder).__name__}.make_envs() returned no envs for a retry of env {index}")
    return group[index] if index < len(group) else group[0]


def _check_retry_fields(max_retries: int, timeout: float | None) -> None:
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    if timeout is not None and timeout < 0:
        raise ValueError(f"per_rollout_timeout must be >= 0 seconds (0 or None: no limit), got {timeout}")


def _group_failed(message: str, rollout: GroupRollout) -> GroupFailedError:
    error = GroupFailedError(message, rollout.errors)
    if rollout.errors:
        error.__cause__ = rollout.errors[-1].error
    return error


async def _attempt(
    policy: TokenPolicy, env: Env, index: int, attempt: int, limit: float | None
) -> Trajectory | RolloutError:
    """One rollout attempt within ``limit`` seconds: its trajectory, or the failure as a :class:`RolloutError`."""
    captured: outcome.Value[Trajectory] | outcome.Error | None = None
    with trio.move_on_after(limit or math.inf) as scope:
        captured = await outcome.acapture(do_single_rollout, policy, env)
        if isinstance(captured, outcome.Error) and not isinstance(captured.error, Exception):
            # Cancellation and KeyboardInterrupt are not rollout failures:
            # re-raise them inside the scope so that our own timeout is
            # caught by it and anything else keeps propagating.
            captured.unwrap()
    if scope.cancelled_caught:
        return RolloutError.from_exception(
            TimeoutError(f"rollout exceeded {limit} s"), env_index=index, attempt=attempt, timed_out=True
        )
    if isinstance(captured, outcome.Error):
        return RolloutError.from_exception(captured.error, env_index=index, attempt=attempt)
    assert captured is not None
    return captured.value


class _RetryBudget:
    """One group's ``max_retries``, given to the failures of one instant together, by :func:`_run_with_retries`'s rules."""

    def __init__(self, max_retries: int, floor: int | None, group: trio.CancelScope) -> None:
        self._left = max_retries
        self._floor = floor
        self._group = group
        self.failed_now: list[int] = []
        """The slots that failed at this instant, not yet answered."""
        self._retries: dict[int, bool] = {}

    def answer(self, *, succeeded: int) -> None:
        """Answer every failure of this instant, ``succeeded`` rollouts of the group having succeeded."""
        # Every failure of one instant is answered together, in slot order, so
        # that which slot gets the last of the budget never depends on which
        # task Trio happened to run first.
        answered = sorted(self.failed_now)
        self.failed_now.clear()
        for index in answered:
            self._retries[index] = self._left > 0 and (self._floor is None or succeeded < self._floor)
            if self._retries[index]:
                self._left -= 1
        if self._floor is None and not all(self._retries[index] for index in answered):
            # The group has failed: none of this instant's failures is retried,
            # and the cancel lands here, in the first of them to wake, before
            # any slot acts on its answer (rebuilds an env, samples again).
            self._retries.update(dict.fromkeys(answered, False))
            self._group.cancel()

    def retries(self, index: int) -> bool:
        """Whether slot ``index``'s answered failure is retried."""
        return self._retries.pop(index)


async def _run_with_retries(
    builder: EnvGroupBuilder,
    envs: Sequence[Env],
    policy_for: PolicyFactory,
    max_retries: int,
    timeout: float | None,
    floor: int | None,
) -> GroupRollout:
    """Roll out every slot, retrying failures from one group-wide budget.

    With ``floor`` None (RetryOnFailure), a failure once the budget is spent
    cancels the other slots. With a floor (MinViableGroup), a failure is only
    retried while fewer than ``floor`` rollouts have succeeded. Failures at the
    same instant draw on the budget in slot order.
    """
    results: list[tuple[Trajectory, Env] | None] = [None] * len(envs)
    errors: list[RolloutError] = []
    group = trio.CancelScope()
    budget = _RetryBudget(max_retries, floor, group)

    async def slot(index: int, env: Env) -> None:
        for attempt in itertools.count():
            result = await _attempt(policy_for(index, attempt), env, index, attempt, timeout)
            if not isinstance(result, RolloutError):
                results[index] = (result, env)
                return
            errors.append(result)
            budget.failed_now.append(index)
            await settle()  # until every failure of this instant has arrived
            if budget.failed_now:
                budget.answer(succeeded=sum(r is not None for r in results))
            if not budget.retries(index):
                return
            env = await _fresh_env(builder, index)

    with group:
        async with trio.open_nursery() as nursery:
            for index, env in enumerate(envs):
                nursery.start_soon(slot, index, env)
    kept = [r for r in results if r is not None]
    errors.sort(key=lambda e: (e.env_index, e.attempt))
    return GroupRollout(trajectories=[t for t, _ in kept], envs=[e for _, e in kept], errors=errors)


@asynccontextmanager
async def group_envs(builder: EnvGroupBuilder) -> AsyncGenerator[Sequence[Env], None]:
    """Make a group's envs and always clean them up afterwards.

    ``cleanup`` runs shielded from cancellation, so a cancelled or crashed run
    still releases what the envs hold, but within :data:`CLEANUP_TIMEOUT_S` so
    that a stuck cleanup cannot hang the run. A cleanup that fails while the
    group is already failing never hides that failure, even one that came with
    a cancellation: both are raised, as the leaves of one group.

    Raises:
        EmptyGroupError: ``make_envs()`` returned no env (no strategy skips it).
    """
    try:
        with span("make_envs"):
            envs = await call_user(builder.make_envs)
        if not envs:
            raise EmptyGroupError(f"{type(builder).__name__}.make_envs() returned no envs; a group needs at least one")
        for env in envs:
            # The check inline: most envs have no limits, and this runs for every env of every group.
            if getattr(env, "rollout_limits", None) is not None:
                refuse_rollout_limits(env)
        yield envs
    except BaseException as failure:
        cleanup_failure = await _cleanup(builder)
        if cleanup_failure is None:
            raise
        if _only_cancellation(failure):
            # Cancellation (or KeyboardInterrupt) alone: the cleanup's failure is the one error.
            raise cleanup_failure from None
        # A crash, perhaps beside a cancellation that came at the same instant
        # (BaseExceptionGroup([crash, Cancelled])): both are raised, as leaves of one group.
        message = f"{type(builder).__name__}: the group failed, then its cleanup failed too"
        if isinstance(failure, Exception):
            raise ExceptionGroup(message, [failure, cleanup_failure]) from None
        raise BaseExceptionGroup(message, [failure, cleanup_failure]) from None
    else:
        cleanup_failure = await _cleanup(builder)
        if cleanup_failure is not None:
            raise cleanup_failure


RUNNER_ONLY_LIMITS = (
    "max_trajectory_tokens",
    "max_sampled_tokens",
    "max_turn_tokens",
    "rollout_timeout_seconds",
    "sampling_turn_timeout_seconds",
)
"""tinker-cookbook 0.6.1's ``RolloutLimits`` fields that trio_rl's runner does not enforce (None: unlimited).

The other two, ``max_turns`` and ``max_tool_calls``, it enforces as 0.6.1's runner does (see
:func:`do_single_rollout`).
"""


def refuse_rollout_limits(env: Env) -> None:
    """Refuse an env whose ``rollout_limits`` (0.6.1's runner-side budgets) set a limit trio_rl cannot enforce.

    0.6.1's runner enforces what such an env advertises (``EnvFromMessageEnv.rollout_limits``,
    set from a ``RolloutConfig``). trio_rl's enforces ``max_turns`` and ``max_tool_calls``;
    the token budgets and the two timeouts would be silently ignored, so they are refused, and
    so is ``max_tool_calls`` on an env that cannot take it (0.6.1 logs a warning and runs on).

    Raises:
        UnenforcedLimitsError: naming ``rollout_limits``, the env and the limits at fault.
    """
    limits = getattr(env, "rollout_limits", None)
    if limits is None:
        return
    chosen = {name: getattr(limits, name) for name in RUNNER_ONLY_LIMITS if getattr(limits, name, None) is not None}
    if chosen:
        settings = ", ".join(f"{name}={value!r}" for name, value in chosen.items())
        raise UnenforcedLimitsError(
            "rollout_limits",
            f"{type(env).__name__} sets {settings}, which tinker-cookbook's rollout runner enforces and "
            "trio_rl's does not (it enforces max_turns and max_tool_calls); build the env without them "
            "(the env's own max_trajectory_tokens and max_generation_tokens do work)",
        )
    if getattr(limits, "max_tool_calls", None) is not None and not callable(getattr(env, "set_max_tool_calls", None)):
        raise UnenforcedLimitsError(
            "rollout_limits",
            f"{type(env).__name__} sets max_tool_calls={limits.max_tool_calls} but has no set_max_tool_calls "
            "to take it, so no one would enforce it",
        )


def _runner_stop(transitions: list[Transition], final_ob: Observation, reason: str) -> Trajectory:
    """0.6.1's ``_finalize_runner_stop``: the last transition ends the episode with ``stop/<reason>`` alone."""
    last = transitions[-1]
    metrics = {k: v for k, v in last.metrics.items() if not k.startswith(STOP_METRIC_PREFIX)}
    metrics[f"{STOP_METRIC_PREFIX}{reason}"] = 1.0
    transitions[-1] = Transition(last.ob, last.ac, last.reward, True, metrics, last.logs)
    return Trajectory(transitions=transitions, final_ob=final_ob, stop_reason=reason)


def _only_cancellation(failure: BaseException) -> bool:
    """Whether ``failure`` holds no :class:`Exception`: only cancellations or interrupts."""
    if isinstance(failure, BaseExceptionGroup):
        return failure.subgroup(Exception) is None
    return not isinstance(failure, Exception)


_NO_OP_CLEANUPS = {
    ("trio_rl.types", "EnvGroupBuilder.cleanup"),
    ("tinker_cookbook.rl.types", "EnvGroupBuilder.cleanup"),
}
"""The base classes' ``cleanup``, ours and tinker-cookbook's, both documented to do nothing."""


def _cleanup_is_a_no_op(builder_type: type) -> bool:
    """Whether ``builder_type`` has no ``cleanup`` (a duck-typed builder) or inherits a no-op one."""
    cleanup = getattr(builder_type, "cleanup", None)
    if cleanup is None:
        return True
    return (getattr(cleanup, "__module__", None), getattr(cleanup, "__qualname__", None)) in _NO_OP_CLEANUPS


async def _cleanup(builder: EnvGroupBuilder) -> Exception | None:
    """Run ``builder.cleanup()`` shielded and bounded; return its exception instead of raising it."""
    if _cleanup_is_a_no_op(type(builder)):
        return None  # no shielded, deadlined scope for a cleanup that does nothing
    with trio.move_on_after(CLEANUP_TIMEOUT_S, shield=True), span("cleanup"):
        try:
            await call_user(builder.cleanup)
        except Exception as exc:
            return exc
    return None


async def rollout_group(
    builder: EnvGroupBuilder,
    envs: Sequence[Env],
    policy_for: PolicyFactory,
    strategy: ErrorStrategy,
    termination: TerminationRewardPolicy | None = None,
) -> TrajectoryGroup:
    """Roll out already-made ``envs`` with ``strategy`` and compute group rewards (under ``termination``)."""
    rollout = await strategy.run(builder, envs, policy_for)

    async def grade() -> list[tuple[float, Metrics]]:
        graded = list(await call_user(builder.compute_group_rewards, rollout.trajectories, rollout.envs))
        if len(graded) != len(rollout.trajectories):
            raise ValueError(
                f"{type(builder).__name__}.compute_group_rewards returned {len(graded)} "
                f"rewards for {len(rollout.trajectories)} trajectories"
            )
        return graded

    with span("compute_group_rewards"):
        rewards_and_metrics = await grade_group(termination, rollout.trajectories, grade)
    return TrajectoryGroup(
        trajectories_G=rollout.trajectories,
        final_rewards_G=[reward for reward, _ in rewards_and_metrics],
        metrics_G=[metrics for _, metrics in rewards_and_metrics],
        rollout_errors=rollout.errors,
    )


async def do_group_rollout(
    builder: EnvGroupBuilder,
    policy_for: PolicyFactory,
    strategy: ErrorStrategy | None = None,
    termination: TerminationRewardPolicy | None = None,
) -> TrajectoryGroup:
    """Make a group's envs, roll them all out, compute group rewards, clean up.

    Args:
        builder: the env group.
        policy_for: ``(env_index, attempt) -> policy``.
        strategy: what failures do (default :class:`FailFast`).
        termination: how rewards depend on the stop reason (None: untouched), as in
            tinker-cookbook 0.6.1's ``do_group_rollout``.

    Returns:
        The group's trajectories, final rewards, metrics and recorded errors.

    Raises:
        GroupFailedError: when a retrying strategy runs out of retries.
        Exception: a failure the strategy does not catch (under ``FailFast``,
            the failing env's), itself, as tinker-cookbook 0.6.1 raises it,
            when it is the only one; when several came at once (rollouts
            failing at the same instant, or the group's cleanup failing after
            it), an ``ExceptionGroup`` of them all, where 0.6.1 would raise the
            first and lose the others.
    """
    try:
        async with group_envs(builder) as envs:
            return await rollout_group(builder, envs, policy_for, strategy or FailFast(), termination)
    except ExceptionGroup as failures:
        lone = _lone_exception(failures)
        if lone is None:
            raise
    # Raised outside the handler, so that the group is not chained to it as its context.
    raise lone


def _lone_exception(group: BaseExceptionGroup[BaseException]) -> BaseException | None:
    """The one exception in ``group`` and its nested groups, if there is exactly one."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending and len(leaves) < 2:
        exc = pending.pop()
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    return leaves[0] if len(leaves) == 1 and not pending else None
