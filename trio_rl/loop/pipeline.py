"""The run's graph: a dataloader, rollout workers, the trainer and the evaluator, in one nursery.

::

    dataloader ──items──▶ rollout_worker × N ──groups──▶ trainer ──(step, client)──▶ evaluator
       │  ▲                                                │ │
       │  └──────────── resample (Requeue only) ◀──────────┘ │
       └──────────────── handout notes ─────────────────────▶┘ (the data ledger)

Every arrow is a memory channel, and every channel end has one owner that
closes it. The end of data needs no bookkeeping: the dataloader closes
``items`` when the data runs out; each worker's ``async for`` then ends and its
``with`` block closes its clone of ``groups``; when the last clone closes, the
trainer sees ``EndOfChannel``, trains what it holds, and closes the
evaluator's channel. Any exception cancels the whole nursery.

What differs between modes is decided by the run's :class:`~trio_rl.loop.schedules.Schedule`,
which the stages ask and which does nothing itself. :func:`run_pipeline` wires
the stages, each a module of :mod:`trio_rl.loop.stages`, read in the order a
group travels: the :func:`~trio_rl.loop.stages.dataloader.dataloader` admits an
item and hands it to a :func:`~trio_rl.loop.stages.workers.rollout_worker`,
which samples it (:func:`~trio_rl.loop.stages.workers.run_work_item`) and sends
the finished group to the trainer; the trainer's
:class:`~trio_rl.loop.stages.intake.GroupIntake` receives it and carries out the
schedule's verdict on it; the :class:`~trio_rl.loop.stages.trainer.Trainer`
submits each minibatch the schedule decides (to the
:class:`~trio_rl.loop.step_runner.StepRunner`, which calls ``forward_backward``
and ``optim_step`` and publishes the new weights), records the step and frees
its groups' admission slots; last, the
:func:`~trio_rl.loop.stages.evaluator.evaluator`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import trio

from ..backends.protocol import SamplingClient
from .channels import closed_unless_crashed
from .checkpoints import CheckpointKeeper
from .evaluation import EvalCadence, EvalRequests, OwedEvaluations
from .items import DatasetItems
from .stages.crashes import Crashes
from .stages.dataloader import dataloader_with_workers
from .stages.evaluator import EVAL_QUEUE_SIZE, Evaluation, evaluator
from .stages.intake import GroupIntake
from .stages.run import Run
from .stages.trainer import Trainer, TrainerOutcome, TrainerParts, TrainerSettings
from .stages.workers import RolloutSettings, WorkerPool
from .step_runner import StepRunner
from .work import Delivery, WorkItem


@dataclass(frozen=True)
class StageSettings:
    """What each stage is given: the dataloader its items, the workers, the trainer and the evaluator their settings."""

    items: DatasetItems
    rollout: RolloutSettings
    trainer: TrainerSettings
    evaluation: Evaluation


async def run_pipeline(
    nursery: trio.Nursery, run: Run, stages: StageSettings, *, runner: StepRunner, checkpoints: CheckpointKeeper
) -> TrainerOutcome:
    """Open the channels, start every stage in ``nursery``, and run the trainer in this task.

    ``nursery`` is the run's own (see :func:`trio_rl.train`): a crash anywhere
    cancels every stage, and the run's error is one group of the original errors.
    """
    evaluation = stages.evaluation
    items_send, items_recv = trio.open_memory_channel[WorkItem](0)
    # Unbounded so that a worker never waits for the trainer to take its group;
    # admission already bounds what can pile up here.
    groups_send, groups_recv = trio.open_memory_channel[Delivery](math.inf)
    evals_send, evals_recv = trio.open_memory_channel[tuple[int, SamplingClient]](EVAL_QUEUE_SIZE)
    stop_rollouts = trio.CancelScope()
    owed = OwedEvaluations()
    crashes = Crashes()
    nursery.start_soon(crashes.watch, evaluator(evaluation, evals_recv, run.metrics, owed, run.observer))
    workers = WorkerPool(items_send, items_recv, groups_send, stages.rollout, run)
    nursery.start_soon(crashes.watch, dataloader_with_workers(stop_rollouts, stages.items, run, workers))
    # A crashing trainer leaves its channels open, so that no stage mistakes
    # the crash for the end of data (and raises beside it).
    with (
        closed_unless_crashed(groups_recv, evals_send),
        run.resampling.closed_unless_crashed(),
    ):
        cadence = EvalCadence(bool(evaluation.evaluators), evaluation.every)
        evals = EvalRequests(cadence, evals_send, run.weights, runner.weights_to_evaluate, owed, evaluation.owed)
        intake = GroupIntake(groups_recv, run, stop_rollouts)
        return await Trainer(stages.trainer, run, TrainerParts(intake, runner, checkpoints, evals, crashes)).run()
