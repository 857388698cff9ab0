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
        return sum(_leaves(inner) for inner in exc.exceptions)
    return 1
