"""Running one training step: submit its minibatches, wait for the backend, publish the new weights."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tinker import types as tinker_types

from ..backends.protocol import PendingResult, SamplingClient, TrainingClient
from ..observe.spans import span
from ..rl.data import without_mask
from ..rl.kl import incorporate_kl_penalty, post_update_kl
from ..types import Metrics
from .publishing import WeightsPublishing
from .schedules import Minibatch
from .weights import LatestWeights
from .work import FinishedGroup


@dataclass(frozen=True)
class StepSettings:
    """What every step's requests carry.

    Attributes:
        loss_fn, loss_fn_config: the loss of every ``forward_backward``, and its parameters.
        adam_params: the parameters of every ``optim_step``.
        kl_penalty_coef, kl_discount_factor: the KL penalty added to the advantages (0: none).
        post_kl: after each step, score its data under the new weights (``Config.compute_post_kl``).
    """

    loss_fn: str
    loss_fn_config: dict[str, float] | None
    adam_params: tinker_types.AdamParams
    kl_penalty_coef: float = 0.0
    kl_discount_factor: float = 0.0
    post_kl: bool = False


@dataclass
class TrainedStep:
    """What one training step did.

    Attributes:
        step: the step's index (its weights become version ``step + 1``).
        taken: every group the step consumed.
        skipped: the step's groups that failed beyond their error tolerance
            (already retired by the trainer; counted here for the record).
        trained: the groups whose data reached ``forward_backward`` (``taken``
            less those removed by the constant-reward filter).
        results: the backend's answers, in submission order.
        submitted: the data of each ``forward_backward``, in submission order
            (with their action masks), to compare the sampler's logprobs with
            the learner's.
        kl_diff_sum, kl_tokens: with a KL penalty, the sum of ``sampled -
            reference`` logprobs over the trained action tokens, and their count.
        post_kl: with ``compute_post_kl``, how far the step moved the policy on
            its data (``kl_pre_post_v1``, ``kl_pre_post_v2``).
        summary: metrics of the step's groups, computed while the backend worked.
        train_seconds: from the first submission to the last answer.
    """

    step: int
    taken: list[FinishedGroup] = field(default_factory=list[FinishedGroup])
    skipped: int = 0
    trained: list[FinishedGroup] = field(default_factory=list[FinishedGroup])
    results: list[Any] = field(default_factory=list[Any])
    submitted: list[list[tinker_types.Datum]] = field(default_factory=list[list[tinker_types.Datum]])
    kl_diff_sum: float = 0.0
    kl_tokens: float = 0.0
    post_kl: Metrics = field(default_factory=dict[str, Any])
    summary: Metrics = field(default_factory=dict[str, Any])
    train_seconds: float = 0.0
    # The runner's own bookkeeping while the step is in flight.
    pending: list[PendingResult[Any]] = field(default_factory=list[PendingResult[Any]], repr=False)
    grads_pending: bool = field(default=False, repr=False)
    started: float | None = field(default=None, repr=False)


class StepRunner:
    """Runs the trainer's steps on a training client and publishes each step's weights.

    Requests are submitted back to back and only then waited for, so the backend
    processes them in order without a round trip in between. A step cancelled
    after it submitted work can be completed with :meth:`finish_interrupted`: a
    submitted request is not taken back, so the state saved afterwards must
    include it.
    """

    def __init__(
        self, client: TrainingClient, weights: LatestWeights, publishing: WeightsPublishing, settings: StepSettings
    ) -> None:
        self._client = client
        self._weights = weights
        self._publishing = publishing
        self._loss_fn = settings.loss_fn
        self._loss_fn_config = settings.loss_fn_config
        self._adam_params = settings.adam_params
        self._kl = (settings.kl_penalty_coef, settings.kl_discount_factor)
        self._post_kl = settings.post_kl
        self._current: TrainedStep | None = None

    def begin(self, step: int) -> None:
        """Start step ``step``: its minibatches follow with :meth:`submit`, then :meth:`finish`."""
        self._current = TrainedStep(step)

    async def submit(self, minibatch: Minibatch) -> None:
        """Submit ``minibatch``'s ``forward_backward`` (and ``optim_step``, if it ends a substep) without waiting."""
        assert self._current is not None, "submit() between begin() and finish()"
        self._current.taken.extend(minibatch.groups)
        self._current.skipped += minibatch.skipped
        await self._submit(self._current, minibatch.trained, optim=minibatch.optim_step)

    async def finish(self, summarize: Callable[[list[FinishedGroup]], Metrics]) -> TrainedStep | None:
        """Wait for the step's answers and publish its weights; None if it had no group (the data has ended).

        A step whose groups were all filtered out (or all skipped) trains nothing and saves no new
        sampler: its weights version is published with the unchanged weights. Which groups a
        step trains is its schedule's decision (:attr:`~trio_rl.loop.schedules.Minibatch.filtered`).
        """
        current = self._current
        assert current is not None, "finish() after begin()"
        if not current.taken and not current.skipped:
            self._current = None
            return None
        current.summary = summarize(current.taken)
        done = await self._complete(current)
        if done.trained:
            with span("save_weights_for_sampler", version=done.step + 1):
                sampler = await self._publishing.publish(self._client, f"{done.step + 1:06d}")
            if self._post_kl:
                # As 0.6.1 does: the step's data scored by the new weights, before they are handed out.
                done.post_kl = await post_update_kl(sampler, [d for data in done.submitted for d in data])
            self._weights.publish(done.step + 1, sampler)
        else:
            self._weights.advance(done.step + 1)
        self._current = None
        return done

    async def weights_to_evaluate(self, version: int, latest: SamplingClient) -> SamplingClient:
        """A client for exactly the weights of ``version``, the latest published (see :meth:`WeightsPublishing.pinned`).

        Call it between steps, when the training client holds ``version``'s weights.
        """
        return await self._publishing.pinned(self._client, version, latest)

    async def finish_interrupted(self, summarize: Callable[[list[FinishedGroup]], Metrics]) -> TrainedStep | None:
        """Complete a step that was cancelled after it had submitted work; None if it had not.

        Its groups not yet submitted stay owed. Call it shielded, with a deadline.
        """
        current, self._current = self._current, None
        if current is None or not current.trained:
            return None
        current.taken = list(current.trained)
        current.summary = summarize(current.taken)
        return await self._complete(current)

    async def _submit(self, current: TrainedStep, kept: list[FinishedGroup], *, optim: bool) -> None:
        if kept and current.started is None:
            current.started = time.perf_counter()
        data = [datum for group in kept for datum in group.data]
        if data and self._kl[0] > 0:
            diffs = [diff for group in kept for diff in group.reference_diffs or []]
            # One forward_backward's data is the cookbook's batch for the average.
            penalty = incorporate_kl_penalty(data, diffs, *self._kl)
            data = penalty.data
            _transcribe_trained(kept, data)
            current.kl_diff_sum += penalty.diff_sum
            current.kl_tokens += penalty.tokens
        if data:
            with span("forward_backward", datums=len(data)):
                pending = await self._client.forward_backward(
                    [without_mask(d) for d in data],
                    self._loss_fn,  # type: ignore[arg-type]  # checked against LossFnType before the run
                    self._loss_fn_config,
                )
            current.pending.append(pending)
            current.submitted.append(data)
            current.trained.extend(kept)
            current.grads_pending = True
        # An optimizer step without gradients would still move Adam's weights by
        # its momentum; a substep whose groups were all filtered out skips it.
        if optim and current.grads_pending:
            with span("optim_step"):
                current.pending.append(await self._client.optim_step(self._adam_params))
            current.grads_pending = False

    async def _complete(self, current: TrainedStep) -> TrainedStep:
        # A substep cut short by the end of data still gets its optim_step.
        await self._submit(current, [], optim=True)
        with span("wait_for_train_results", requests=len(current.pending)):
            current.results = [await pending.result() for pending in current.pending]
        now = time.perf_counter()
        current.train_seconds = now - (now if current.started is None else current.started)
        return current


def _transcribe_trained(kept: list[FinishedGroup], data: list[tinker_types.Datum]) -> None:
    """Give the transcripts of ``kept`` the Datums as trained (``data``, in ``kept``'s order)."""
    offset = 0
    for group in kept:
        if group.transcript is not None:
            group.transcript = group.transcript.with_trained_data(data[offset : offset + len(group.data)])
        offset += len(group.data)
