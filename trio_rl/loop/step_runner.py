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
from ..rl.kl import incorporate_kl_penalty
from ..types import Metrics
from .schedules import Minibatch
from .weights import LatestWeights
from .work import FinishedGroup


async def publish_weights(client: TrainingClient, name: str, *, inflight: bool) -> SamplingClient:
    """Save ``client``'s weights for sampling as ``name``, in flight where asked.

    A snapshot save passes no ``inflight`` argument, so a training client written
    before in-flight weights existed (a user's wrapper, a test double) still works.
    """
    if inflight:
        return await client.save_weights_for_sampler(name, inflight=True)
    return await client.save_weights_for_sampler(name)


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
        self,
        client: TrainingClient,
        weights: LatestWeights,
        *,
        loss_fn: str,
        loss_fn_config: dict[str, float] | None,
        adam_params: tinker_types.AdamParams,
        remove_constant_reward_groups: bool,
        keep_one_constant_group: bool = False,
        kl_penalty_coef: float = 0.0,
        kl_discount_factor: float = 0.0,
        inflight: bool = False,
    ) -> None:
        self._client = client
        self._inflight = inflight
        self._weights = weights
        self._loss_fn = loss_fn
        self._loss_fn_config = loss_fn_config
        self._adam_params = adam_params
        self._filter = remove_constant_reward_groups
        # Sync mode in tinker-cookbook 0.6.1: a batch whose groups all have constant rewards keeps its first.
        self._keep_one = keep_one_constant_group
        self._kl = (kl_penalty_coef, kl_discount_factor)
        self._current: TrainedStep | None = None

    def begin(self, step: int) -> None:
        """Start step ``step``: its minibatches follow with :meth:`submit`, then :meth:`finish`."""
        self._current = TrainedStep(step)

    async def submit(self, minibatch: Minibatch) -> None:
        """Submit ``minibatch``'s ``forward_backward`` (and ``optim_step``, if it ends a substep) without waiting."""
        assert self._current is not None, "submit() between begin() and finish()"
        self._current.taken.extend(minibatch.groups)
        self._current.skipped += minibatch.skipped
        await self._submit(self._current, minibatch.groups, optim=minibatch.optim_step)

    async def finish(self, summarize: Callable[[list[FinishedGroup]], Metrics]) -> TrainedStep | None:
        """Wait for the step's answers and publish its weights; None if it had no group (the data has ended).

        A step whose groups were all filtered out (or all skipped) trains nothing and saves no new
        sampler: its weights version is published with the unchanged weights. With
        ``keep_one_constant_group`` (sync mode), an all-filtered step trains its first group instead.
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
                sampler = await publish_weights(self._client, f"{done.step + 1:06d}", inflight=self._inflight)
            self._weights.publish(done.step + 1, sampler)
        else:
            self._weights.advance(done.step + 1)
        self._current = None
        return done

    async def weights_to_evaluate(self, version: int, latest: SamplingClient) -> SamplingClient:
        """A client for exactly the weights of ``version``, the latest published: ``latest``, or a snapshot of it.

        Call it between steps, when the training client holds ``version``'s weights.
        An in-flight client (``latest`` in an in-flight run) adopts the next step's
        weights while it samples, so an evaluation gets a snapshot saved now instead.
        """
        if not self._inflight:
            return latest
        return await self._client.save_weights_for_sampler(f"{version:06d}-eval")

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

    async def _submit(
        self, current: TrainedStep, groups: list[FinishedGroup], *, optim: bool, keep: bool = False
    ) -> None:
        if groups and current.started is None:
            current.started = time.perf_counter()
        kept = [g for g in groups if keep or not (self._filter and g.summary.constant_reward)]
        data = [datum for group in kept for datum in group.data]
        if data and self._kl[0] > 0:
            diffs = [diff for group in kept for diff in group.reference_diffs or []]
            # One forward_backward's data is the cookbook's batch for the average.
            penalty = incorporate_kl_penalty(data, diffs, *self._kl)
            data = penalty.data
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
        if self._keep_one and not current.trained and current.taken:
            await self._submit(current, current.taken[:1], optim=True, keep=True)
        # A substep cut short by the end of data still gets its optim_step.
        await self._submit(current, [], optim=True)
        with span("wait_for_train_results", requests=len(current.pending)):
            current.results = [await pending.result() for pending in current.pending]
        now = time.perf_counter()
        current.train_seconds = now - (now if current.started is None else current.started)
        return current
