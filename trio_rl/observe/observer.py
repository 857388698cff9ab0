"""One run's observation: its trace, step windows, transcripts and stall watch, behind the stages' hooks.

:func:`trio_rl.train` builds a :class:`RunObserver` from the run's
:class:`ObserveSettings`, makes its :class:`~trio_rl.observe.spans.Watch` the
run's (so every stage's :func:`~trio_rl.observe.spans.span` reaches it), runs
its stall watch in the run's nursery, tells it when each step is recorded, and
closes it on every way out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from .evaluations import EvaluationTranscripts
from .spans import SpanRecord, Watch
from .stall import ActivitySeen, StallSnapshot, StallWatch
from .task_tree import format_task_tree
from .timeline import write_timeline
from .timing import StepWindow, timing_metrics
from .trace import TraceFile
from .transcripts import Decode, GroupTranscript, TranscriptWriter, iteration_dir, token_ids
from .waits import waits_by_activity


@dataclass(frozen=True)
class ObserveSettings:
    """What a run writes to be seen inside (the ``Config`` fields of the same names).

    Attributes:
        log_path: the run folder.
        start_step: the step this run starts at (a resumed run's trace gets a file of its own).
        transcripts_every: every this many steps, write transcripts (0: never).
        transcript_groups: groups per transcript.
        trace: write a Perfetto/Chrome trace-event JSON of the run.
        timeline_every: every this many steps, write the step's HTML timeline (0: never).
        stall_warning_s: seconds without a finished step before a stall report (None: never).
    """

    log_path: Path
    start_step: int = 0
    transcripts_every: int = 0
    transcript_groups: int = 4
    trace: bool = False
    timeline_every: int = 0
    stall_warning_s: float | None = 120.0

    @property
    def records_spans(self) -> bool:
        """Whether spans are timed (for the trace file, the timelines and the ``time/*`` metrics)."""
        return self.trace or self.timeline_every > 0

    def trace_path(self) -> Path:
        """The trace file of this run (a resumed run writes one of its own beside the earlier ones)."""
        return self.log_path / f"trace_from_step_{self.start_step:06d}.json"


@dataclass(frozen=True)
class StepSeen:
    """What the observer is told of a recorded step: its index, and its groups' transcripts with whether each trained."""

    step: int
    groups: Sequence[tuple[GroupTranscript | None, bool]]


class RunObserver:
    """The run's trace file, current step window, transcript writer and stall watch.

    Args:
        settings: what to write.
        decode: token ids to text for transcripts (default: the ids).
        snapshot_parts: the run's state for a stall report: ``(last_step,
            outstanding items, statistics by primitive)``.
    """

    def __init__(
        self,
        settings: ObserveSettings,
        *,
        decode: Decode = token_ids,
        snapshot_parts: Callable[[], tuple[int, Sequence[str], Mapping[str, Any]]] = lambda: (-1, (), {}),
    ) -> None:
        self.settings = settings
        now = trio.current_time()
        self._trace = TraceFile(settings.trace_path(), origin=now) if settings.trace else None
        self._window = StepWindow(now) if settings.records_spans else None
        self.watch = Watch(self._on_span if settings.records_spans else None)
        self.watch.transcripts = settings.transcripts_every > 0
        self._writer = TranscriptWriter(settings.log_path, decode) if self.watch.transcripts else None
        self._parts = snapshot_parts
        self.stall = StallWatch(settings.stall_warning_s, self._snapshot)

    def _on_span(self, record: SpanRecord) -> None:
        if self._trace is not None:
            self._trace.write(record)
        if self._window is not None:
            self._window.add(record)

    def _snapshot(self, last_progress: float) -> StallSnapshot:
        last_step, outstanding, statistics = self._parts()
        waits = waits_by_activity()
        return StallSnapshot(
            now=trio.current_time(),
            last_progress=last_progress,
            last_step=last_step,
            activities=[
                ActivitySeen(a.what, a.started, a.attempt, dict(waits.get(key, {})))
                for key, a in self.watch.activities.items()
            ],
            outstanding=list(outstanding),
            statistics=dict(statistics),
            task_tree=format_task_tree(),
        )

    def step_recorded(self, seen: StepSeen) -> dict[str, float]:
        """Write what is due for this step; its ``time/*`` metrics (none unless spans are timed)."""
        self.stall.progressed()
        s, step = self.settings, seen.step
        if self._writer is not None and step % s.transcripts_every == 0:
            groups = [(t, trained) for t, trained in seen.groups if t is not None][: s.transcript_groups]
            self._writer.write("train", step, groups)
        if self._window is None:
            return {}
        end = trio.current_time()
        start, spans = self._window.take(end)
        if s.timeline_every and step % s.timeline_every == 0:
            write_timeline(iteration_dir(s.log_path, step) / "timing_gantt.html", step, start, end, spans)
        return timing_metrics(spans)

    def evaluation_collector(self, version: int) -> EvaluationTranscripts | None:
        """A collector for the evaluation of ``version``, when the run writes transcripts."""
        if self._writer is None:
            return None
        return EvaluationTranscripts(version, self.settings.transcript_groups)

    def write_evaluation(self, collected: EvaluationTranscripts | None) -> None:
        """Write what an evaluation's evaluators collected, under the evaluated step."""
        if self._writer is None or collected is None:
            return
        for name, groups in collected.by_name.items():
            self._writer.write(name, collected.version, [(groups[i], False) for i in sorted(groups)])

    def stall_report(self) -> str:
        """The stall report as of now, whether or not the run is stalled (what ``SIGUSR1`` prints)."""
        return self.stall.report_now()

    async def watch_for_stalls(self) -> None:
        """Run the stall watch until cancelled (returns at once when it is off)."""
        await self.stall.run()

    def close(self) -> None:
        """End the trace file; the run calls it on every way out."""
        if self._trace is not None:
            self._trace.close()
