"""The metrics of one training step, as pure functions of what the step did."""

from __future__ import annotations

from collections.abc import Sequence
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
from tinker import types as tinker_types

from .data import MASK_KEY

from .metrics import trajectory_metrics
from .types import Metrics
from .work import FinishedGroup


@dataclass(frozen=True)
class RunCounts:
    """Cumulative counts of a run so far, as the trainer knows them at the end of a step.

    Attributes:
        trained_groups: groups that reached ``forward_backward``.
        filtered_groups: groups removed by the constant-reward filter.
        requeued: groups sent back to be sampled again.
        dropped_stale: groups dropped as too stale after the data ran out.
        in_flight_max: the most groups handed out and not yet consumed at any step's start.
        empty_batches: empty dataset batches skipped.
        groups_skipped: groups that failed beyond their error tolerance.
        error_types: failed rollout attempts of the groups that were kept, by
            exception class name (as the cookbook's ``RolloutErrorCounter``, which
            counts a skipped group only in ``groups_skipped``).
    """

    trained_groups: int = 0
    filtered_groups: int = 0
    requeued: int = 0
    dropped_stale: int = 0
    in_flight_max: int = 0
    empty_batches: int = 0
    groups_skipped: int = 0
    error_types: tuple[tuple[str, int], ...] = ()

    def with_errors_of(self, groups: Sequence[FinishedGroup]) -> tuple[tuple[str, int], ...]:
        """``error_types`` after also counting the rollout errors of ``groups``."""
        counts = Counter(dict(self.error_types))
        counts.update(e.error_type for g in groups for e in g.group.rollout_errors)
        return tuple(sorted(counts.items()))


def group_metrics(step: int, groups: Sequence[FinishedGroup], groups_per_step: int) -> Metrics:
    """What the groups of step ``step`` say: rewards, tokens, staleness, rollout errors.

    A step whose groups were all skipped has no groups: it reports only its counts.
    """
    versions = [g.version for g in groups]
    metrics: Metrics = {
        "progress/groups": len(groups),
        # Smaller than the run's batch size: the end of data, a short dataset batch, or skipped groups.
        "progress/partial_batch": int(len(groups) < groups_per_step),
        "rollouts/errors": sum(len(g.group.rollout_errors) for g in groups),
    }
    if not groups:
        return metrics
    metrics.update(
        {
            "sampling_client/step_min": min(versions),
            "sampling_client/step_max": max(versions),
            "sampling_client/step_mean": sum(versions) / len(versions),
            "sampling_client/staleness_max": step - min(versions),
        }
    )
    metrics.update(trajectory_metrics([g.group for g in groups], [g.tags for g in groups]))
    return metrics


def count_metrics(counts: RunCounts) -> Metrics:
    """The run's cumulative counts under their metric names."""
    return {
        "progress/trained_groups": counts.trained_groups,
        "async/requeued": counts.requeued,
        "async/dropped_stale": counts.dropped_stale,
        "rollouts/in_flight_max": counts.in_flight_max,
        "data/groups_filtered_constant": counts.filtered_groups,
        "data/empty_batches": counts.empty_batches,
        **rollout_error_metrics(counts),
    }


def rollout_error_metrics(counts: RunCounts) -> Metrics:
    """``rollout_errors/<ErrorType>``, ``/total`` and ``/groups_skipped``, cumulative; none until the first error.

    The cookbook's ``RolloutErrorCounter.get_metrics``, key for key.
    """
    if not counts.error_types and not counts.groups_skipped:
        return {}
    metrics: Metrics = {f"rollout_errors/{name}": float(n) for name, n in counts.error_types}
    metrics["rollout_errors/total"] = float(sum(n for _, n in counts.error_types))
    metrics["rollout_errors/groups_skipped"] = float(counts.groups_skipped)
    return metrics


def _loss_sum(output: tinker_types.ForwardBackwardOutput) -> float:
    if "loss:sum" in output.metrics:
        return output.metrics["loss:sum"]
    # Some Tinker-compatible servers (SkyRL) report only per-token losses.
    return sum(
        float(out["elementwise_loss"].to_numpy().sum()) for out in output.loss_fn_outputs if "elementwise_loss" in out
    )


def sample_train_kl(
    submitted: Sequence[Sequence[tinker_types.Datum]], outputs: Sequence[tinker_types.ForwardBackwardOutput]
) -> Metrics:
    """The cookbook's ``compute_kl_sample_train``: sampler against learner logprobs on the action tokens.

    ``optim/kl_sample_train_v1`` is the mean of ``sampling - training`` logprobs,
    ``_v2`` half the mean of its square, ``optim/entropy`` minus the mean
    sampling logprob. Empty when the backend returned no logprobs (or no action
    token was trained).
    """
    diffs: list[np.ndarray] = []
    sampled: list[np.ndarray] = []
    for data, output in zip(submitted, outputs):
        if len(output.loss_fn_outputs) != len(data):
            return {}
        for datum, out in zip(data, output.loss_fn_outputs):
            if "logprobs" not in out or MASK_KEY not in datum.loss_fn_inputs or "logprobs" not in datum.loss_fn_inputs:
                return {}
            mask = datum.loss_fn_inputs[MASK_KEY].to_numpy() > 0
            sampling = datum.loss_fn_inputs["logprobs"].to_numpy()[mask]
            training = out["logprobs"].to_numpy()[: len(mask)][mask]
            diffs.append(sampling - training)
            sampled.append(sampling)
    flat = np.concatenate(diffs) if diffs else np.zeros(0)
    if flat.size == 0:
        return {}
    return {
        "optim/kl_sample_train_v1": float(flat.mean()),
        "optim/kl_sample_train_v2": float(0.5 * (flat**2).mean()),
        "optim/entropy": float(-np.concatenate(sampled).mean()),
    }


def result_metrics(results: Sequence[Any]) -> Metrics:
    """``train/loss:sum`` over the step's ``forward_backward`` answers and the optimizer's metrics."""
    metrics: Metrics = {}
    loss = 0.0
    for result in results:
        if isinstance(result, tinker_types.ForwardBackwardOutput):
            loss += _loss_sum(result)
        elif isinstance(result, tinker_types.OptimStepResponse) and result.metrics:
            metrics.update({f"optim/{k}": v for k, v in result.metrics.items()})
    metrics["train/loss:sum"] = loss
    return metrics
