"""Evaluators, and when the trainer asks for an evaluation."""

from __future__ import annotations

import time
from typing import Protocol

import trio

from ..asyncio_bridge import call_evaluator
from ..backends.protocol import SamplingClient
from ..errors import EvaluationTimeoutError
from ..types import Metrics
from .channels import send_downstream
from .weights import LatestWeights


class SamplingClientEvaluator(Protocol):
    """Scores the weights behind a sampling client, as in tinker-cookbook.

    The returned metrics are logged under the step whose weights were evaluated.
    """

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]: ...


def evaluator_name(evaluator: object) -> str:
    """A readable name for an evaluator: its function or class name."""
    return getattr(evaluator, "__qualname__", None) or type(evaluator).__qualname__


async def evaluate(
    evaluators: tuple[SamplingClientEvaluator, ...], step: int, client: SamplingClient, timeout: float
) -> Metrics:
    """Run every evaluator on ``client`` in turn, each within ``timeout`` seconds.

    Raises:
        EvaluationTimeoutError: naming the evaluator, the step and the time it had.
    """
    results: Metrics = {}
    started = time.perf_counter()
    for evaluator in evaluators:
        with trio.move_on_after(timeout) as scope:
            results.update(await call_evaluator(evaluator, client))
        if scope.cancelled_caught:
            raise EvaluationTimeoutError(evaluator_name(evaluator), step, timeout)
    results["time/run_evals"] = time.perf_counter() - started
    return results


class EvalSchedule:
    """Which weights versions get evaluated: every ``eval_every``-th and the final one, each once.

    The trainer owns it. ``due`` answers at most once per version, so the last
    step is never evaluated twice even when it is also a periodic one.
    """

    def __init__(self, has_evaluators: bool, eval_every: int) -> None:
        self._enabled = has_evaluators
        self._every = eval_every
        self._last: int | None = None

    def due(self, version: int, *, final: bool = False) -> bool:
        """Whether to evaluate ``version`` now (and remember that it was)."""
        if not self._enabled or self._last == version:
            return False
        if not final and not (self._every and version % self._every == 0):
            return False
        self._last = version
        return True


class EvalRequests:
    """The trainer's side of the evaluator channel."""

    def __init__(
        self, schedule: EvalSchedule, send: trio.MemorySendChannel[tuple[int, SamplingClient]], weights: LatestWeights
    ) -> None:
        self._schedule = schedule
        self._send = send
        self._weights = weights

    async def request_if_due(self, version: int, *, final: bool = False) -> None:
        """Send ``version``'s sampling client to the evaluator if its evaluation is due."""
        if self._schedule.due(version, final=final):
            await send_downstream(self._send, (version, self._weights.latest()[1]))

    def close(self) -> None:
        """No more requests: the evaluator ends once it has done those sent."""
        self._send.close()
