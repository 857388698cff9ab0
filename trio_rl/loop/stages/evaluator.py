"""The evaluator: evaluates each weights version the trainer sends it."""

from __future__ import annotations

from dataclasses import dataclass

import trio

from ...backends.protocol import SamplingClient
from ...base.determinism import settle
from ...observe.evaluations import collecting
from ...observe.observer import RunObserver
from ...observe.spans import activity, on_track, span
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
    observer: RunObserver | None = None,
) -> None:
    """Evaluate each weights version the trainer sends, once, logging under its step (and its transcripts)."""
    with requests, on_track("evaluator"), activity("evaluator"):
        async for version, client in requests:
            collector = None if observer is None else observer.evaluation_collector(version)
            with span("run_evals", step=version), collecting(collector):
                results = await evaluate(evaluation.evaluators, version, client, evaluation.timeout)
            # A checkpoint reads what is owed right after its own settle(), possibly at the
            # instant this evaluation ends: settling first puts the record after that read
            # whatever Trio's task order, so the row and metrics.jsonl agree either way.
            await settle()
            if observer is not None:
                observer.write_evaluation(collector)
            metrics.write(version, results)
            owed.done(version)
