"""The metrics of one training step, as pure functions of what the step did."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from tinker import types as tinker_types

from .. import _tinker_compat as compat
from ..base.reduced_metrics import add_reduced
from ..rl.data import MASK_KEY
from ..rl.metrics import summary_metrics
from ..types import Metrics
from .work import FinishedGroup

if TYPE_CHECKING:
    from .step_runner import TrainedStep


@dataclass(frozen=True)
class RunCounts:
    """Cumulative counts of a run so far, as the trainer knows them at the end of a step.

    Attributes:
        trained_groups: groups that reached ``forward_backward``.
        filtered_groups: groups removed by the constant-reward filter.
        requeued: groups resampled.
        dropped_stale: groups dropped as too stale after the data ran out.
        in_flight_max: the most groups handed out and not yet consumed at any step's start.
        empty_batches: empty dataset batches skipped.
        groups_skipped: groups that failed beyond their error tolerance.
        error_types: failed rollout attempts of the groups that were kept, by
            exception class name (as the cookbook's ``RolloutErrorCounter``, which
            counts a skipped group only in ``groups_skipped``).
        cumulative_tokens: every token counted so far (discarded ones included),
            carried across a resume by the checkpoint rows.
        discarded_tokens: tokens of groups removed by the constant-reward filter.
    """

    trained_groups: int = 0
    filtered_groups: int = 0
    requeued: int = 0
    dropped_stale: int = 0
    in_flight_max: int = 0
    empty_batches: int = 0
    groups_skipped: int = 0
    error_types: tuple[tuple[str, int], ...] = ()
    cumulative_tokens: TokenCounts = field(default_factory=lambda: TokenCounts())
    discarded_tokens: TokenCounts = field(default_factory=lambda: TokenCounts())

    def to_json(self) -> dict[str, Any]:
        """The group counts, for a checkpoint row (tokens have rows of their own)."""
        raw = asdict(self)
        del raw["cumulative_tokens"], raw["discarded_tokens"]
        raw["error_types"] = dict(self.error_types)
        return raw

    @classmethod
    def from_checkpoint(
        cls, counts: dict[str, Any] | None, cumulative: dict[str, int] | None, discarded: dict[str, int] | None
    ) -> RunCounts:
        """The counts a checkpoint row recorded (zeros for a row written before rows had them)."""
        raw = dict(counts or {})
        errors = raw.pop("error_types", {})
        kept = {k: int(v) for k, v in raw.items() if k in cls.__dataclass_fields__}
        return cls(
            **kept,
            error_types=tuple(sorted((str(k), int(v)) for k, v in dict(errors).items())),
            cumulative_tokens=TokenCounts.from_json(cumulative),
            discarded_tokens=TokenCounts.from_json(discarded),
        )

    def with_errors_of(self, groups: Sequence[FinishedGroup]) -> tuple[tuple[str, int], ...]:
        """``error_types`` after also counting the rollout errors of ``groups``."""
        counts = Counter(dict(self.error_types))
        counts.update(e.error_type for g in groups for e in g.summary.rollout_errors)
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
        "rollouts/errors": sum(len(g.summary.rollout_errors) for g in groups),
        "rollouts/initial_overflow": sum(g.summary.initial_overflows for g in groups),
    }
    if not groups:
        return metrics
    staleness = [step - v for v in versions]
    metrics.update(
        {
            "sampling_client/step_min": min(versions),
            "sampling_client/step_max": max(versions),
            "sampling_client/step_mean": sum(versions) / len(versions),
            "async/staleness_min": min(staleness),
            "async/staleness_max": max(staleness),
            "async/staleness_mean": sum(staleness) / len(staleness),
        }
    )
    metrics.update(summary_metrics([g.summary for g in groups], [g.tags for g in groups]))
    return metrics


@dataclass(frozen=True)
class TokenCounts:
    """Tokens by the kinds the cookbook bills (its ``TokenUsage``).

    Attributes:
        sampled: tokens the sampler returned (action tokens).
        prefill_cached: prompt tokens a sampler served from its prefix cache (``SampleResponse.prompt_cache_hit_tokens``).
        prefill_uncached: prompt tokens of sampling and reference-scoring requests.
        trained: tokens of the Datums sent to ``forward_backward``.
    """

    sampled: int = 0
    prefill_cached: int = 0
    prefill_uncached: int = 0
    trained: int = 0

    def __add__(self, other: TokenCounts) -> TokenCounts:
        # Field by field: ``astuple`` deep-copies each value, and this runs for every step's tally.
        return TokenCounts(
            self.sampled + other.sampled,
            self.prefill_cached + other.prefill_cached,
            self.prefill_uncached + other.prefill_uncached,
            self.trained + other.trained,
        )

    def metrics(self, prefix: str) -> Metrics:
        """``<prefix>/<kind>`` for each kind."""
        return {f"{prefix}/{name}": value for name, value in asdict(self).items()}

    @classmethod
    def from_json(cls, raw: dict[str, int] | None) -> TokenCounts:
        """From a checkpoint row's ``cumulative_tokens``/``discarded_tokens`` (None: zeros)."""
        return cls(**{k: int(v) for k, v in (raw or {}).items() if k in cls.__dataclass_fields__})


def rollout_tokens(groups: Sequence[FinishedGroup]) -> TokenCounts:
    """What sampling (and reference scoring) of ``groups`` used."""
    sampled = cached = prefill = 0
    for g in groups:
        sampled += g.summary.ac_tokens
        cached += g.summary.cached_ob_tokens
        prefill += g.summary.ob_tokens - g.summary.cached_ob_tokens
        if g.reference_diffs is not None:
            prefill += sum(compat.token_count(d.model_input) + 1 for d in g.data)
    return TokenCounts(sampled=sampled, prefill_cached=cached, prefill_uncached=prefill)


def step_tokens(trained: Sequence[FinishedGroup], submitted: Sequence[Sequence[tinker_types.Datum]]) -> TokenCounts:
    """A step's tokens: its trained groups' rollouts and its submitted data, as the cookbook's ``CostTracker`` counts them.

    The rollouts of filtered groups are counted apart, as discarded (:func:`rollout_tokens`).
    """
    trained_tokens = sum(compat.token_count(d.model_input) for data in submitted for d in data)
    return rollout_tokens(trained) + TokenCounts(trained=trained_tokens)


def count_metrics(counts: RunCounts) -> Metrics:
    """The run's cumulative counts under their metric names."""
    return {
        "progress/trained_groups": counts.trained_groups,
        "async/requeued": counts.requeued,
        "async/dropped_stale": counts.dropped_stale,
        "rollouts/in_flight_max": counts.in_flight_max,
        "data/groups_filtered_constant": counts.filtered_groups,
        "data/empty_batches": counts.empty_batches,
        **counts.cumulative_tokens.metrics("tokens/cumulative"),
        **counts.discarded_tokens.metrics("tokens/discarded"),
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
    for data, output in zip(submitted, outputs, strict=True):
        if len(output.loss_fn_outputs) != len(data):
            return {}
        for datum, out in zip(data, output.loss_fn_outputs, strict=True):
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
    """``train/loss:sum`` over the step's ``forward_backward`` answers, the optimizer's metrics, and
    the importance weights' statistics where the backend reported them (:func:`offpolicy_metrics`)."""
    metrics: Metrics = {}
    loss = 0.0
    for result in results:
        if isinstance(result, tinker_types.ForwardBackwardOutput):
            loss += _loss_sum(result)
        elif isinstance(result, tinker_types.OptimStepResponse) and result.metrics:
            metrics.update({f"optim/{k}": v for k, v in result.metrics.items()})
    metrics["train/loss:sum"] = loss
    metrics.update(offpolicy_metrics([r for r in results if isinstance(r, tinker_types.ForwardBackwardOutput)]))
    return metrics


def offpolicy_metrics(outputs: Sequence[tinker_types.ForwardBackwardOutput]) -> Metrics:
    """The step's importance weights ``w = exp(p - q)`` over its trained tokens, from the in-process backends' sums.

    Returns:
        Nothing when no answer carries ``offpolicy/tokens:sum`` (Tinker, the
        fake); else ``offpolicy/tokens``, ``offpolicy/is_weight_mean``,
        ``offpolicy/is_weight_max`` (before any clamp or mask),
        ``offpolicy/corrected_frac`` (tokens clamped or masked),
        ``offpolicy/ess`` (the effective sample size of the applied
        coefficients ``c``, ``(sum c)^2 / (n * sum c^2)``, 1 when every token
        weighs the same, 0 when every one is masked) and
        ``offpolicy/sequences_masked_frac`` (data dropped by a sequence mask).
    """
    total: dict[str, float] = {}
    for output in outputs:
        add_reduced(total, output.metrics, "offpolicy/")
    tokens = total.get("offpolicy/tokens:sum", 0.0)
    if not tokens:
        return {}
    square = total["offpolicy/coef_sq:sum"]
    sequences = total["offpolicy/sequences:sum"]
    return {
        "offpolicy/tokens": tokens,
        "offpolicy/is_weight_mean": total["offpolicy/is_weight:sum"] / tokens,
        "offpolicy/is_weight_max": total["offpolicy/is_weight_max:max"],
        "offpolicy/corrected_frac": total["offpolicy/corrected:sum"] / tokens,
        "offpolicy/ess": total["offpolicy/coef:sum"] ** 2 / (tokens * square) if square > 0 else 0.0,
        "offpolicy/sequences_masked_frac": total["offpolicy/sequences_masked:sum"] / sequences if sequences else 0.0,
    }


def token_lag_metrics(step: int, trained: Sequence[FinishedGroup], inflight: bool = False) -> Metrics:
    """How stale the step's trained tokens are: ``async/token_lag_mean`` (token-weighted) and ``_max``.

    A token's lag is ``step`` minus the weights version that produced it. Where
    its group's sampler said which version produced each token (an in-flight
    client of a backend that knows), that version; otherwise the group's own
    (the client's at its creation), which is exact with snapshot weights. An
    in-flight run whose backend does not say (Tinker) thus records an upper
    bound, and marks the record with ``async/token_lag_is_bound`` = 1.

    Args:
        step: the training step.
        trained: the groups whose data the step trained.
        inflight: whether the run publishes its weights in flight.
    """
    lags: dict[int, int] = {}
    bound = False
    for group in trained:
        summary = group.summary
        if summary.token_versions is not None:
            for version, count in summary.token_versions:
                lags[step - version] = lags.get(step - version, 0) + count
        elif summary.trained_tokens:
            lags[step - group.version] = lags.get(step - group.version, 0) + summary.trained_tokens
            bound = bound or inflight
    tokens = sum(lags.values())
    if not tokens:
        return {}
    metrics: Metrics = {
        "async/token_lag_mean": sum(lag * count for lag, count in lags.items()) / tokens,
        "async/token_lag_max": max(lag for lag, count in lags.items() if count),
    }
    if bound:
        metrics["async/token_lag_is_bound"] = 1.0
    return metrics


def trained_step_metrics(
    done: TrainedStep, counts: RunCounts, tokens: TokenCounts, planned_steps: int | None, *, lags_are_bounds: bool
) -> Metrics:
    """The record of one trained step, under tinker-cookbook's keys where it has one.

    ``progress/batch`` and ``training_client/step`` are the step's index (the
    cookbook's sync and async loops each write one of them), and
    ``progress/done_frac`` is ``(step + 1) / planned_steps``. ``lags_are_bounds``:
    the run's publishing says token lags are bounds where the backend does not
    say which weights produced a token (:attr:`~trio_rl.loop.publishing.WeightsPublishing.token_lags_are_bounds`).
    """
    outputs = [r for r in done.results if isinstance(r, tinker_types.ForwardBackwardOutput)]
    metrics: Metrics = {
        **done.summary,
        **token_lag_metrics(done.step, done.trained, lags_are_bounds),
        **result_metrics(done.results),
        **sample_train_kl(done.submitted, outputs),
        **count_metrics(counts),
        **tokens.metrics("tokens"),
        "progress/batch": done.step,
        "training_client/step": done.step,
        "time/train_step": done.train_seconds,
    }
    if planned_steps:
        metrics["progress/done_frac"] = (done.step + 1) / planned_steps
    if done.kl_tokens:
        metrics["kl_policy_base"] = done.kl_diff_sum / done.kl_tokens
    metrics.update(done.post_kl)
    return metrics


def final_record(final_step: int, stopped_by_max_steps: bool, counts: RunCounts, cancelled: int) -> Metrics:
    """The final weights' record: where every group of the run went."""
    return {
        "run/final_step": final_step,
        "run/stopped_by_max_steps": int(stopped_by_max_steps),
        "run/trained_groups": counts.trained_groups,
        "run/dropped_stale": counts.dropped_stale,
        "run/requeued": counts.requeued,
        "run/cancelled_groups": cancelled,
        "run/filtered_constant": counts.filtered_groups,
        "run/empty_batches": counts.empty_batches,
        "run/groups_skipped": counts.groups_skipped,
        **rollout_error_metrics(counts),
    }
