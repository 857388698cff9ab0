"""Entry points: :func:`train` for Trio programs and :func:`run` for plain scripts."""

from __future__ import annotations

import json
import warnings
from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from ..async_loss import with_async_loss
from ..asyncio_bridge import open_user_code_runner
from ..backends.protocol import Backend, SamplingClient, TrainingClient
from ..base.jsonl import RunFolderWarning, read_records
from ..config import Config, check_inflight_on_backend, check_loss_on_backend
from ..errors import one_per_fault
from ..observe.observer import ObserveSettings, RunObserver
from ..observe.spans import watching
from ..observe.transcripts import token_ids
from ..rl.epochs import with_epochs
from ..rl.rollouts import ParamsPerCall
from ..types import EnvGroupBuilder, RLDataset
from . import run_folder
from .checkpoints import CheckpointKeeper, CheckpointLog, CheckpointRecord
from .evaluation import SamplingClientEvaluator
from .gate import ConsumptionGate
from .items import DatasetItems
from .ledger import DataLedger
from .metrics_log import MetricsLog, merge_by_step
from .pipeline import StageSettings, run_pipeline
from .publishing import publishing_for
from .resampling import resampling_for
from .schedules import Schedule
from .selected_schedule import schedule_for
from .stages.evaluator import Evaluation
from .stages.run import Run
from .stages.trainer import TrainerOutcome, TrainerSettings
from .stages.workers import RolloutSettings
from .step_metrics import RunCounts
from .step_runner import StepRunner, StepSettings
from .weights import LatestWeights


@dataclass
class RunHandle:
    """What :func:`train` hands to ``nursery.start`` once the first sampling client exists.

    Attributes:
        metrics: every record as it is written to ``metrics.jsonl`` (a step's
            training record when the step ends, an evaluation's record when it
            ends); the channel ends when the run ends. It holds at most
            :data:`LIVE_BUFFER` records not yet read; a reader that falls further
            behind misses records (they are still in ``metrics.jsonl``).
        log_path: the run's folder.
    """

    metrics: trio.MemoryReceiveChannel[dict[str, Any]]
    log_path: Path
    _weights: LatestWeights
    _observer: RunObserver | None = None

    def stall_report(self) -> str:
        """The stall report as of now: what each group being rolled out, the trainer and the dataloader wait on."""
        if self._observer is None:
            return "no stall report: the run is not observed"
        return self._observer.stall_report()

    @property
    def step(self) -> int:
        """Training steps completed so far (the newest weights version)."""
        return self._weights.version


LIVE_BUFFER = 10_000
"""Records :attr:`RunHandle.metrics` holds for a reader that has not taken them yet."""


@dataclass(frozen=True)
class TrainResult:
    """What a finished run returns.

    Attributes:
        final_step: training steps completed (the version of the final weights).
        stopped_by_max_steps: whether ``max_steps`` ended the run rather than the data.
        checkpoint: the final checkpoint.
        trained_groups: groups that went into a training step (in the whole run: a
            resumed run continues the counts of the checkpoint it resumed from).
        dropped_groups: groups dropped as too stale after the data ran out (likewise).
        cancelled_groups: groups handed out but never trained (rollouts cancelled at ``max_steps``).
        summary: the final-weights record: where every group went.
        metrics_path: the run's ``metrics.jsonl``.
        first_step: the step this run (or, when resumed, this part of it) started at.
    """

    final_step: int
    stopped_by_max_steps: bool
    checkpoint: CheckpointRecord | None
    trained_groups: int
    dropped_groups: int
    cancelled_groups: int
    summary: dict[str, Any]
    metrics_path: Path
    first_step: int

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """This run's records, read back from ``metrics.jsonl``: one dict per step, in step order.

        Each merges the step's training metrics and the evaluation of its weights;
        the last is the final weights' (``run/...`` accounting of every group, and
        the final evaluation if there are evaluators). Read on each access: the
        run keeps no history in memory.
        """
        return merge_by_step([r for r in read_records(self.metrics_path) if r["step"] >= self.first_step])

    @property
    def step_metrics(self) -> list[dict[str, Any]]:
        """The records of training steps only (without the final-weights record)."""
        return [m for m in self.metrics if "progress/groups" in m]


@asynccontextmanager
async def _one_error_per_fault() -> AsyncGenerator[None, None]:
    try:
        yield
    except BaseExceptionGroup as group:
        deduplicated = one_per_fault(group)
        if deduplicated is group:
            raise
        raise deduplicated from None


@asynccontextmanager
async def _run_nursery(config: Config) -> AsyncGenerator[trio.Nursery, None]:
    """The nursery of the run's stages, which raises one error per fault."""
    # User code that needs asyncio runs on one loop that lives as long as the stages.
    async with _one_error_per_fault(), open_user_code_runner(config.asyncio_bridge), trio.open_nursery() as nursery:
        yield nursery


def _check_before_work(
    config: Config, dataset: RLDataset, backend: Backend
) -> tuple[Config, RLDataset, Sequence[EnvGroupBuilder]]:
    """Resolve the backend's defaults into ``config`` and validate it against the backend and the
    dataset's first batch (built once).

    Returns:
        The resolved configuration, the dataset over ``num_epochs`` passes, and its first batch.
    """
    config = with_async_loss(config, backend)
    first_batch: Sequence[EnvGroupBuilder] = dataset.get_batch(0) if len(dataset) > 0 else []
    config.validate(dataset_batch_size=len(first_batch) if len(dataset) > 0 else None)
    check_loss_on_backend(config, backend)
    check_inflight_on_backend(config, backend)
    return config, with_epochs(dataset, config.num_epochs), first_batch


async def train(
    config: Config,
    *,
    dataset: RLDataset,
    backend: Backend,
    evaluators: Sequence[SamplingClientEvaluator] = (),
    task_status: trio.TaskStatus[RunHandle] = trio.TASK_STATUS_IGNORED,
) -> TrainResult:
    """Train a policy on ``dataset`` with ``backend``.

    All stages run in one nursery that lives exactly as long as this call.
    Use it directly (``await train(...)``) or with ``await nursery.start(train, ...)``,
    which returns a :class:`RunHandle` once the first sampling client exists.
    Cancelling the enclosing scope stops the run promptly.

    Args:
        config: the run's configuration; checked before any work starts.
        dataset: batches of env group builders.
        backend: an entered backend (``async with backend:``).
        evaluators: run concurrently on the weights of every ``eval_every``-th step
            and on the final weights.
        task_status: for ``nursery.start``.

    Returns:
        The per-step metrics, the final step and the final checkpoint.

    Raises:
        ConfigError: an invalid configuration, raised as itself before any work.
        ExceptionGroup: once work has started, any failure (an env, an evaluator,
            the backend, the trainer) cancels every stage and is raised in an
            ``ExceptionGroup`` whose leaves are the original exceptions; catch them
            with ``except*``. The run never hangs on a failure.
    """
    config, dataset, first_batch = _check_before_work(config, dataset, backend)
    run_folder.claim(config, dataset_length=len(dataset))
    inputs = _Inputs(config=config, dataset=dataset, first_batch=first_batch, backend=backend, evaluators=evaluators)
    checkpoint_log = CheckpointLog(Path(config.log_path))
    run: Run | None = None
    try:
        async with _run_nursery(config) as nursery:
            # Setting up inside the nursery makes its failures arrive like any other.
            begin = await run_folder.start(config, backend, checkpoint_log)
            run = await _open_run(config, begin, len(first_batch), _live_buffer(task_status))
            outcome = await _run_stages(nursery, inputs, begin, run, checkpoint_log, task_status)
    finally:
        if run is not None:
            run.metrics.close()
            if run.observer is not None:
                # On every way out, a crash and a cancellation too: the trace file ends whole.
                run.observer.close()
    assert run is not None, "the run was opened before its pipeline returned"
    return _result(outcome, run.metrics, Path(config.log_path), begin.step)


@dataclass(frozen=True, kw_only=True)
class _Inputs:
    """What :func:`train` was given, checked: the configuration resolved for the backend, the dataset over its epochs."""

    config: Config
    dataset: RLDataset
    first_batch: Sequence[EnvGroupBuilder]
    backend: Backend
    evaluators: Sequence[SamplingClientEvaluator]


async def _run_stages(
    nursery: trio.Nursery,
    inputs: _Inputs,
    begin: run_folder.Start,
    run: Run,
    checkpoint_log: CheckpointLog,
    task_status: trio.TaskStatus[RunHandle],
) -> TrainerOutcome:
    """Publish the first weights, then run the stages to the end, each watched by the run's observer."""
    config, backend, first_batch = inputs.config, inputs.backend, inputs.first_batch
    rollout = await _rollout_settings(config, backend)
    first = await run.publishing.publish(begin.training_client, f"{begin.step:06d}")
    run.weights.publish(begin.step, first)
    observer = run.observer
    assert observer is not None, "train() always observes its run"
    # Every stage started from here on reports its spans to the run's watch.
    with watching(observer.watch):
        stalls = trio.CancelScope()
        nursery.start_soon(_watch_for_stalls, observer, stalls)
        task_status.started(RunHandle(run.metrics.live, Path(config.log_path), run.weights, observer))
        stages = StageSettings(
            items=DatasetItems(inputs.dataset, first_batch, begin.cursor, begin.owed),
            rollout=rollout,
            trainer=_trainer_settings(config, run.schedule, begin.resumed_from, len(inputs.dataset), len(first_batch)),
            evaluation=await _evaluation(config, backend, begin, inputs.evaluators),
        )
        outcome = await run_pipeline(
            nursery,
            run,
            stages,
            runner=_step_runner(config, begin.training_client, run),
            checkpoints=_checkpoint_keeper(config, checkpoint_log, begin, run),
        )
        stalls.cancel()
    return outcome


def _checkpoint_keeper(config: Config, log: CheckpointLog, begin: run_folder.Start, run: Run) -> CheckpointKeeper:
    return CheckpointKeeper(
        log,
        begin.training_client,
        run.ledger,
        run.weights,
        save_on_cancel=config.save_on_cancel,
        cancel_save_timeout=config.cancel_save_timeout,
    )


async def _evaluation(
    config: Config, backend: Backend, begin: run_folder.Start, evaluators: Sequence[SamplingClientEvaluator]
) -> Evaluation:
    owed = await _owed_evaluations(config, backend, begin, has_evaluators=bool(evaluators))
    return Evaluation(tuple(evaluators), config.eval_every, config.eval_timeout, owed=owed)


async def _open_run(config: Config, begin: run_folder.Start, first_batch_size: int, live_buffer: int) -> Run:
    """The run's shared collaborators, once its folder is ready (a resume has just cut ``metrics.jsonl`` back)."""
    log_path = Path(config.log_path)
    (log_path / run_folder.CONFIG_FILE).write_text(json.dumps(config.to_json(), indent=2, default=repr))
    schedule = schedule_for(config, first_batch_size)
    ledger, gate = DataLedger(begin.cursor, begin.owed), ConsumptionGate()
    resampling = resampling_for(schedule, ledger, gate)
    weights = LatestWeights(on_publish=resampling.published)

    def snapshot_parts() -> tuple[int, list[str], dict[str, Any]]:
        statistics = {"weights": weights.statistics(), "admission": gate.statistics(), "ledger": ledger.statistics()}
        return weights.version, [f"{k.batch}/{k.group}" for k in ledger.outstanding_as_read()], statistics

    transcripts = config.transcripts_every > 0 and config.transcript_groups > 0
    decode = (await begin.training_client.get_tokenizer()).decode if transcripts else token_ids
    observer = RunObserver(_observe_settings(config, begin.step), decode=decode, snapshot_parts=snapshot_parts)
    return Run(
        start_step=begin.step,
        schedule=schedule,
        weights=weights,
        ledger=ledger,
        gate=gate,
        metrics=MetricsLog(log_path / run_folder.METRICS_FILE, live_buffer=live_buffer),
        publishing=publishing_for(config),
        resampling=resampling,
        observer=observer,
    )


def _observe_settings(config: Config, start_step: int) -> ObserveSettings:
    return ObserveSettings(
        log_path=Path(config.log_path),
        start_step=start_step,
        transcripts_every=config.transcripts_every if config.transcript_groups > 0 else 0,
        transcript_groups=config.transcript_groups,
        trace=config.trace,
        timeline_every=config.timeline_every,
        stall_warning_s=config.stall_warning_s,
    )


async def _watch_for_stalls(observer: RunObserver, stop: trio.CancelScope) -> None:
    """The stall watch, until ``stop`` is cancelled (when the pipeline returns) or the run is."""
    with stop:
        await observer.watch_for_stalls()


def _live_buffer(task_status: trio.TaskStatus[RunHandle]) -> int:
    """Records the live channel holds: none unless a caller of ``nursery.start`` may read them."""
    return LIVE_BUFFER if task_status is not trio.TASK_STATUS_IGNORED else 0


async def _rollout_settings(config: Config, backend: Backend) -> RolloutSettings:
    reference = None
    if config.kl_penalty_coef > 0 and config.kl_reference_config is not None:
        ref = config.kl_reference_config
        reference = await backend.create_sampling_client(base_model=ref.base_model, model_path=ref.load_checkpoint_path)
    return RolloutSettings(
        seed=config.seed,
        # Built once: validating a SamplingParams per rollout showed up in profiles.
        sampling_params=ParamsPerCall(config.sampling_params()),
        error_strategy=config.rollout_strategy(),
        loss_fn=config.training_loss_fn(),
        max_workers=config.num_workers,
        reference=reference,
        termination=config.termination,
    )


def _trainer_settings(
    config: Config, schedule: Schedule, resumed: CheckpointRecord | None, num_batches: int, first_batch_size: int
) -> TrainerSettings:
    planned = schedule.planned_steps(num_batches, first_batch_size)
    return TrainerSettings(
        groups_per_step=schedule.groups_per_step,
        max_steps=config.max_steps,
        save_every=config.save_every,
        planned_steps=planned if config.max_steps is None else min(planned, config.max_steps),
        start_counts=RunCounts()
        if resumed is None
        else RunCounts.from_checkpoint(resumed.counts, resumed.cumulative_tokens, resumed.discarded_tokens),
        learning_rate=config.learning_rate,
        rolling_save_every=config.rolling_save_every,
    )


async def _owed_evaluations(
    config: Config, backend: Backend, begin: run_folder.Start, *, has_evaluators: bool
) -> tuple[tuple[int, SamplingClient], ...]:
    """The evaluations the checkpoint resumed from still owed, each with a sampling client of its weights.

    One whose weights were not saved by name, or whose folder is gone, cannot be run again; it is
    named in a warning. (An in-process backend deletes a sampler's folder once no client holds
    it, unless a state of the same name was saved: an owed evaluation of a step with no state.)
    """
    owed = begin.resumed_from.owed_evaluations if begin.resumed_from is not None and has_evaluators else []
    if owed:
        # Those that finished after the row was written are in the log already.
        metrics_path = Path(config.log_path) / run_folder.METRICS_FILE
        done = (
            {r["step"] for r in read_records(metrics_path) if "time/run_evals" in r} if metrics_path.exists() else set()
        )
        owed = [(version, path) for version, path in owed if version not in done]
    clients: list[tuple[int, SamplingClient]] = []
    for version, path in owed:
        reason = "its weights were not saved by name (sampler_path)"
        if path is not None:
            try:
                client = await backend.create_sampling_client(base_model=config.base_model, model_path=path)
            except FileNotFoundError as error:
                reason = f"its weights are gone ({error})"
            else:
                clients.append((version, client))
                continue
        warnings.warn(
            f"the evaluation of step {version} was due when the run stopped, but {reason}, so it cannot be run now",
            RunFolderWarning,
            stacklevel=3,
        )
    return tuple(clients)


def _step_runner(config: Config, client: TrainingClient, run: Run) -> StepRunner:
    settings = StepSettings(
        loss_fn=config.training_loss_fn(),
        loss_fn_config=config.loss_fn_config,
        adam_params=config.adam_params(),
        kl_penalty_coef=config.kl_penalty_coef,
        kl_discount_factor=config.kl_discount_factor,
        post_kl=config.compute_post_kl,
    )
    return StepRunner(client, run.weights, run.publishing, settings)


def _result(outcome: TrainerOutcome, metrics_log: MetricsLog, log_path: Path, first_step: int) -> TrainResult:
    summary = metrics_log.last_final
    assert summary is not None, "the trainer writes the final record before it returns"
    return TrainResult(
        final_step=outcome.final_step,
        stopped_by_max_steps=outcome.stopped_by_max_steps,
        checkpoint=outcome.checkpoint,
        trained_groups=outcome.counts.trained_groups,
        dropped_groups=outcome.counts.dropped_stale,
        cancelled_groups=outcome.cancelled_groups,
        summary=summary,
        metrics_path=log_path / run_folder.METRICS_FILE,
        first_step=first_step,
    )


def run(
    config: Config,
    *,
    dataset: RLDataset,
    backend: Backend,
    evaluators: Sequence[SamplingClientEvaluator] = (),
) -> TrainResult:
    """Synchronous wrapper: enter ``backend`` and :func:`train` under ``trio.run``."""

    async def main() -> TrainResult:
        async with backend:
            return await train(config, dataset=dataset, backend=backend, evaluators=evaluators)

    return trio.run(main)
