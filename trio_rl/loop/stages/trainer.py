"""The trainer: trains the schedule's steps, records each, checkpoints, and asks for evaluations."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

import trio

from ...errors import NonFiniteError
from ...observe.observer import StepSeen
from ...observe.spans import activity, on_track, span
from ...types import Metrics
from ..checkpoints import CheckpointKeeper, CheckpointRecord
from ..evaluation import EvalRequests
from ..step_metrics import (
    RunCounts,
    final_record,
    group_metrics,
    rollout_tokens,
    step_tokens,
    trained_step_metrics,
)
from ..step_runner import StepRunner, TrainedStep
from ..work import FinishedGroup
from .crashes import Crashes
from .intake import GroupIntake
from .run import Run


@dataclass(frozen=True)
class TrainerSettings:
    """What the trainer needs besides its collaborators."""

    groups_per_step: int
    max_steps: int | None
    save_every: int
    planned_steps: int | None = None
    """The steps the run expects in all (for ``progress/done_frac``), when known."""
    learning_rate: float | None = None
    """Written as ``optim/lr`` when the backend's optimizer reports none, as the cookbook always writes it."""
    start_counts: RunCounts = field(default_factory=RunCounts)
    """Group and token counts before this run (from the checkpoint resumed), which this run continues."""
    rolling_save_every: int = 0
    """Also save every N steps that ``save_every`` does not, recorded as ``"rolling"`` (0: never)."""

    def save_reason(self, step: int) -> str | None:
        """Why the state after ``step`` steps is saved: ``"periodic"``, ``"rolling"`` (0.6.1's cadence), or not at all."""
        if self.save_every and step % self.save_every == 0:
            return "periodic"
        if self.rolling_save_every and step % self.rolling_save_every == 0:
            return "rolling"
        return None


@dataclass(frozen=True)
class TrainerParts:
    """The trainer's collaborators, each with one job.

    Attributes:
        intake: receives the groups and carries out the schedule's verdict on each.
        runner: submits a step's minibatches and publishes its weights.
        checkpoints: saves the state with the ledger's view of the data.
        evals: asks the evaluator for the evaluations that are due.
        crashes: whether a stage around the trainer crashed (rather than the run being cancelled).
    """

    intake: GroupIntake
    runner: StepRunner
    checkpoints: CheckpointKeeper
    evals: EvalRequests
    crashes: Crashes


@dataclass(frozen=True)
class TrainerOutcome:
    """How the trainer finished."""

    final_step: int
    stopped_by_max_steps: bool
    counts: RunCounts
    cancelled_groups: int
    checkpoint: CheckpointRecord | None


class Trainer:
    """Trains the schedule's steps, records each, checkpoints, and asks for evaluations."""

    def __init__(self, settings: TrainerSettings, run: Run, parts: TrainerParts) -> None:
        self._settings = settings
        self._run = run
        self._crashes = parts.crashes
        self._intake = parts.intake
        self._runner = parts.runner
        self._checkpoints = parts.checkpoints
        self._evals = parts.evals
        self.step = run.start_step
        self.counts = settings.start_counts
        self._started = time.perf_counter()

    async def run(self) -> TrainerOutcome:
        """Train until the data runs out or ``max_steps``, then evaluate and save the final weights."""
        with on_track("trainer"), activity("trainer"):
            return await self._run_observed()

    async def _run_observed(self) -> TrainerOutcome:
        try:
            await self._evals.request_owed()
            await self._evals.request_if_due(self.step)
            stopped = await self._train_steps()
            # At max_steps the rollouts still running are of no use.
            await self._intake.stop()
            return await self._finish(stopped)
        except trio.Cancelled:
            # A crash is no end of data: nothing is saved after it.
            checkpoints = self._checkpoints
            if checkpoints.save_on_cancel and checkpoints.final is None and not self._crashes.seen:
                with trio.move_on_after(checkpoints.cancel_save_timeout, shield=True):
                    await self._save_on_cancel()
            raise

    async def _save_on_cancel(self) -> None:
        interrupted = await self._runner.finish_interrupted(self._summarize)
        if interrupted is not None:
            self._record(interrupted)
        # Groups skipped, filtered or dropped since the last record are
        # retired from the ledger: the row must count them.
        self.counts = self._tally(self.counts)
        await self._save(final=True, reason="cancelled")

    async def _train_steps(self) -> bool:
        """Whether ``max_steps`` (rather than the end of data) stopped training."""
        max_steps = self._settings.max_steps
        # Counted from the start of training, so a resumed run stops where the
        # original one would have.
        while max_steps is None or self.step < max_steps:
            done = await self._train_step()
            if done is None:
                return False
            if max_steps is None or done.step + 1 < max_steps:
                # A later step's group skipped, filtered or resampled at this
                # instant is in this record whatever Trio's task order (past
                # max_steps nothing more is classified: those groups are cancelled).
                await self._intake.classify_this_instant(done.step + 1)
            self._record(done)
            # Only now, with the step's weights published, may more work start:
            # it starts on those weights rather than on ones already stale.
            self._run.gate.free(g.item for g in done.taken)
            if (reason := self._settings.save_reason(self.step)) is not None:
                await self._save(final=False, reason=reason)
            await self._evals.request_if_due(self.step)
        return True

    async def _train_step(self) -> TrainedStep | None:
        """Submit each minibatch the schedule decides as soon as it does, then publish the step's weights."""
        with span("train_step", step=self.step):
            self._intake.expire(self.step)
            self._runner.begin(self.step)
            while (minibatch := await self._intake.next_minibatch(self.step)) is not None:
                await self._runner.submit(minibatch)
            return await self._runner.finish(self._summarize)

    async def _save(self, *, final: bool, reason: str) -> CheckpointRecord | None:
        """Save the state with the counts so far, which must already include every group retired from the ledger."""
        counts = self.counts
        with span("save_checkpoint", step=self.step, reason=reason):
            return await self._checkpoints.save(
                self.step,
                final=final,
                reason=reason,
                tokens=(asdict(counts.cumulative_tokens), asdict(counts.discarded_tokens)),
                counts=counts.to_json(),
                owed_evaluations=lambda: self._evals.owed.before(self.step),
            )

    def _summarize(self, groups: list[FinishedGroup]) -> Metrics:
        return group_metrics(self.step, groups, self._settings.groups_per_step)

    def _tally(self, counts: RunCounts, filtered: Sequence[FinishedGroup] = ()) -> RunCounts:
        """``counts`` with every group fate counted since: the intake's and the ledger's, and ``filtered`` (a step's own)."""
        return tally(counts, self._settings.start_counts, self._intake, self._run.ledger.empty_batches, filtered)

    def _record(self, done: TrainedStep) -> None:
        ledger = self._run.ledger
        # Counted before the step's own groups are retired: they were in flight until now.
        in_flight = len(ledger.outstanding)
        ledger.retire(g.item.key for g in done.taken)
        c = self.counts
        trained_ids = {id(g) for g in done.trained}
        tokens = step_tokens(done.trained, done.submitted)
        self.counts = self._tally(
            replace(
                c,
                trained_groups=c.trained_groups + len(done.trained),
                in_flight_max=max(c.in_flight_max, in_flight),
                error_types=c.with_errors_of(done.taken),
                cumulative_tokens=c.cumulative_tokens + tokens,
            ),
            filtered=[g for g in done.taken if id(g) not in trained_ids],
        )
        settings = self._settings
        metrics = trained_step_metrics(
            done,
            self.counts,
            tokens,
            settings.planned_steps,
            lags_are_bounds=self._run.publishing.token_lags_are_bounds,
        )
        if not math.isfinite(metrics["train/loss:sum"]):
            # Checked before anything is recorded or saved: the state is unusable.
            raise NonFiniteError(f"step {done.step}: the loss is {metrics['train/loss:sum']}; the run stops unsaved")
        if self._settings.learning_rate is not None:
            metrics.setdefault("optim/lr", self._settings.learning_rate)
        metrics["time/total"] = time.perf_counter() - self._started
        if (observer := self._run.observer) is not None:
            seen = StepSeen(done.step, [(g.transcript, id(g) in trained_ids) for g in done.taken])
            # The loop's own time/* keys (time/train_step, time/total) keep their meaning.
            for key, value in observer.step_recorded(seen).items():
                metrics.setdefault(key, value)
        self.step = done.step + 1
        self._run.metrics.write(done.step, metrics)

    async def _finish(self, stopped: bool) -> TrainerOutcome:
        self._run.ledger.read_notes()
        counts = self.counts = self._tally(self.counts)
        cancelled = len(self._run.ledger.outstanding)
        # The final weights get a record of their own: where the data went.
        self._run.metrics.write(self.step, final_record(self.step, stopped, counts, cancelled))
        await self._evals.request_if_due(self.step, final=True)
        self._evals.close()
        checkpoint = await self._save(final=True, reason="final")
        return TrainerOutcome(self.step, stopped, counts, cancelled, checkpoint)


def tally(
    counts: RunCounts, start: RunCounts, intake: GroupIntake, empty_batches: int, filtered: Sequence[FinishedGroup]
) -> RunCounts:
    """``counts`` with every group fate counted since: the intake's, the ledger's ``empty_batches``, and ``filtered``.

    The intake and the ledger count this run's groups; a resumed run adds them to
    ``start``, the checkpoint's counts. ``filtered`` are a step's own filtered groups.
    """
    filtered = [*filtered, *intake.take_filtered()]
    discarded = rollout_tokens(filtered)
    return replace(
        counts,
        requeued=start.requeued + intake.resampled,
        dropped_stale=start.dropped_stale + intake.dropped,
        groups_skipped=start.groups_skipped + intake.groups_skipped,
        empty_batches=start.empty_batches + empty_batches,
        filtered_groups=counts.filtered_groups + len(filtered),
        cumulative_tokens=counts.cumulative_tokens + discarded,
        discarded_tokens=counts.discarded_tokens + discarded,
    )
