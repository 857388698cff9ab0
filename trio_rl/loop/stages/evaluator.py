"""The evaluator: evaluates each weights version the trainer sends it."""

from __future__ import annotations

from dataclasses import dataclass

import trio

from ...backends.protocol import SamplingClient
from ..evaluation import OwedEvaluations, SamplingClientEvaluator, evaluate
from ..metrics_log import MetricsLog

EVAL_QUEUE_SIZE = 4
"""Due evaluations that may wait while the evaluator is busy before the trainer waits too."""


@dataclass(frozen=True)
class Evaluation:
    """The evaluators, how often they run (every ``every``-th step and the final weights), and their time limit."""

    evaluators: tuple[SamplingClientEvaluator, ...]
    every: int
    timeout: float
    owed: tuple[tuple[int, SamplingClient], ...] = ()
    """Evaluations a resumed run owes from before its checkpoint: each version and its weights."""


async def evaluator(
    evaluation: Evaluation,
    requests: trio.MemoryReceiveChannel[tuple[int, SamplingClient]],
    metrics: MetricsLog,
    owed: OwedEvaluations,
) -> None:
    """Evaluate each weights version the trainer sends, once, logging under its step."""
    with requests:
        async for version, client in requests:
            metrics.write(version, await evaluate(evaluation.evaluators, version, client, evaluation.timeout))
            owed.done(version)
