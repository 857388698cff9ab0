"""Evaluators, and when the trainer asks for an evaluation."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
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


class EvalCadence:
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


class OwedEvaluations:
    """Evaluations requested and not yet recorded, by weights version, with the sampler path of each.

    The trainer adds a version when it asks for its evaluation, the evaluator
    removes it once its record is written. A checkpoint saves what is owed at
    that moment, so a cancel while evaluations wait or run loses none of them:
    the resumed run asks for them first.
    """

    def __init__(self) -> None:
        self._owed: dict[int, str | None] = {}

    def add(self, version: int, client: SamplingClient) -> None:
        """``version``'s evaluation was asked for."""
        self._owed[version] = client.model_path

    def done(self, version: int) -> None:
        """``version``'s evaluation is recorded."""
        self._owed.pop(version, None)

    def before(self, step: int) -> list[tuple[int, str | None]]:
        """``(version, sampler_path)`` of the evaluations owed of versions before ``step``, oldest first.

        A resumed run evaluates its start step and later ones as it reaches
        them, so only the older ones are owed across a checkpoint.
        """
        return sorted((v, path) for v, path in self._owed.items() if v < step)


class EvalRequests:
    """The trainer's side of the evaluator channel."""

    def __init__(
        self,
        cadence: EvalCadence,
        send: trio.MemorySendChannel[tuple[int, SamplingClient]],
        weights: LatestWeights,
        pinned: Callable[[int, SamplingClient], Awaitable[SamplingClient]],
        owed: OwedEvaluations | None = None,
        owed_from_before: Sequence[tuple[int, SamplingClient]] = (),
    ) -> None:
        self._cadence = cadence
        self._send = send
        self._weights = weights
        self._pinned = pinned
        self.owed = owed if owed is not None else OwedEvaluations()
        self._owed_from_before = owed_from_before

    async def request_owed(self) -> None:
        """Ask for the evaluations a resumed run owes from before its checkpoint (each version with its weights)."""
        for version, client in self._owed_from_before:
            await self.request(version, client)

    async def request_if_due(self, version: int, *, final: bool = False) -> None:
        """Send ``version``'s sampling client to the evaluator if its evaluation is due.

        The client sent is the one ``pinned`` (``StepRunner.weights_to_evaluate``)
        gives for the latest: one that keeps ``version``'s weights while it samples.
        """
        if self._cadence.due(version, final=final):
            client = await self._pinned(version, self._weights.latest()[1])
            await self.request(version, client)

    async def request(self, version: int, client: SamplingClient) -> None:
        """Send ``client`` to be evaluated as version ``version`` (one owed from before a resume)."""
        self.owed.add(version, client)
        await send_downstream(self._send, (version, client))

    def close(self) -> None:
        """No more requests: the evaluator ends once it has done those sent."""
        self._send.close()
