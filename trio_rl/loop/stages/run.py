"""What every stage of one run shares."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...observe.observer import RunObserver
from ..gate import ConsumptionGate
from ..ledger import DataLedger
from ..metrics_log import MetricsLog
from ..publishing import WeightsPublishing
from ..resampling import NoResampling, Resampling
from ..schedules import Schedule
from ..weights import LatestWeights


@dataclass(frozen=True)
class Run:
    """What every stage of one run shares; built by :func:`trio_rl.train`.

    Attributes:
        start_step: the step this run starts at (0, or the step resumed from).
        schedule: the mode's decisions (one fresh schedule per run).
        weights: the newest sampling client; the trainer publishes, the workers read.
        ledger: the items handed out and not yet trained or dropped (the trainer's).
        gate: the groups the trainer has consumed, which the dataloader waits on.
        metrics: the run's ``metrics.jsonl``.
        publishing: how the weights reach the samplers (snapshots or in flight), chosen once.
        resampling: what resampling does beyond deciding (a ``NoResampling`` where the schedule never resamples).
        observer: what the run writes to be seen inside (transcripts, trace, timelines); None writes nothing.
    """

    start_step: int
    schedule: Schedule
    weights: LatestWeights
    ledger: DataLedger
    gate: ConsumptionGate
    metrics: MetricsLog
    publishing: WeightsPublishing
    resampling: Resampling | NoResampling = field(default_factory=NoResampling)
    observer: RunObserver | None = None
