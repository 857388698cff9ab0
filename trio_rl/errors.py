"""The error types trio_rl raises itself.

Errors from envs, evaluators and backends are never wrapped: a failing run raises
an ``ExceptionGroup`` whose leaves are the original exceptions (see
:func:`trio_rl.train`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .types import RolloutError


class ConfigError(ValueError):
    """An invalid configuration, reported before any work starts.

    Attributes:
        field: the configuration field at fault.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class DatasetTooShortError(ConfigError):
    """A resumed run's checkpoint continues the dataset past its end.

    Its dataset is not the one the run started with; raised before anything in
    the run folder is rewritten.

    Attributes:
        checkpoint: the checkpoint's name (``%06d`` of its step, or ``"final"``).
        cursor: the ``(batch, group)`` the checkpoint continues from, or the furthest item it still owes.
        dataset_length: the batches the dataset has.
    """

    def __init__(self, checkpoint: str, step: int, path: str, cursor: tuple[int, int], dataset_length: int) -> None:
        super().__init__(
            "resume",
            f"checkpoint {checkpoint} (step {step}) in {path} continues the dataset at batch {cursor[0]}, "
            f"group {cursor[1]}, but the dataset has {dataset_length} batches; resume with the dataset this "
            "run was started with, or start a new run (another log_path, or overwrite=True, --overwrite)",
        )
        self.checkpoint = checkpoint
        self.cursor = cursor
        self.dataset_length = dataset_length


class BadValueError(ValueError):
    """A value from user code that no error strategy may skip: it stops the run at once.

    A retrying strategy skips and counts a group that fails; a bad value is not
    such a failure but a defect of the env's code, and skipping it could skip
    every group and "finish" having trained nothing.
    """


class EmptyGroupError(BadValueError):
    """``EnvGroupBuilder.make_envs()`` returned no env; the message names the builder."""


class UnenforcedLimitsError(ConfigError, BadValueError):
    """An env asks its rollout runner to enforce budgets that trio_rl's runner does not enforce.

    tinker-cookbook 0.6.1's envs built from a ``RolloutConfig`` carry ``rollout_limits`` for
    its runner (``rl/rollout_runner.py``) to enforce. Training without the token budgets or
    the timeouts would train on rollouts the recipe meant to bound, so the run stops,
    whatever the error strategy.
    """


def stops_the_run(failure: BaseException) -> bool:
    """Whether ``failure`` is, or holds, a :class:`BadValueError`: no strategy may skip its group."""
    if isinstance(failure, BaseExceptionGroup):
        return failure.subgroup(BadValueError) is not None
    return isinstance(failure, BadValueError)


class GroupFailedError(RuntimeError):
    """An env group could not produce a usable group of trajectories.

    Raised by the retrying error strategies once retries are exhausted. The failed
    attempts are in :attr:`errors`, and the last one is chained as ``__cause__``.
    """

    def __init__(self, message: str, errors: Sequence[RolloutError]) -> None:
        super().__init__(message)
        self.errors = list(errors)


class EvaluationTimeoutError(TimeoutError):
    """An evaluator did not finish within ``Config.eval_timeout``; the run ends with this error.

    Attributes:
        evaluator: the evaluator's name.
        step: the step whose weights it was evaluating.
        seconds: how long it had run.
    """

    def __init__(self, evaluator: str, step: int, seconds: float) -> None:
        super().__init__(
            f"evaluator {evaluator} on the weights of step {step} did not finish within {seconds:g} s "
            "(Config.eval_timeout)"
        )
        self.evaluator = evaluator
        self.step = step
        self.seconds = seconds


class NonFiniteError(FloatingPointError):
    """A reward, advantage or loss that is NaN or infinite; nothing is trained on it.

    The message names the group (or the step) where it appeared.
    """


def one_per_fault(group: BaseExceptionGroup[BaseException]) -> BaseExceptionGroup[BaseException]:
    """``group`` with every exception object kept once.

    One fault shared by many waiters (a sampler or training thread that died
    under forty pending requests) reaches each of them as the same exception
    object; it is one error, and is reported once. Distinct exceptions, even
    with equal messages, are all kept.
    """
    seen: set[int] = set()

    def first_sighting(exc: BaseException) -> bool:
        if isinstance(exc, BaseExceptionGroup):
            return False  # look inside
        if id(exc) in seen:
            return False
        seen.add(id(exc))
        return True

    kept = group.subgroup(first_sighting)
    assert kept is not None, "a group always keeps its first leaf"
    return group if _leaves(kept) == _leaves(group) else kept


def _leaves(exc: BaseException) -> int:
    if isinstance(exc, BaseExceptionGroup):
        group: BaseExceptionGroup[BaseException] = exc  # pyright: ignore[reportUnknownVariableType]
        return sum(_leaves(e) for e in group.exceptions)
    return 1
