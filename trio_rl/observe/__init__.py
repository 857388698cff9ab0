"""Seeing inside a run: transcripts, a trace, step timelines, ``time/*`` metrics and the stall report.

See the guide page "Seeing inside a run" (``docs/guides/seeing-inside.md``).
"""

from .observer import ObserveSettings, RunObserver, StepSeen
from .spans import Activity, SpanRecord, Watch, activity, current_watch, on_free_lane, on_track, span, watching
from .stall import ActivitySeen, StallSnapshot, StallWatch, format_stall_report
from .task_tree import format_task_tree
from .timeline import timeline_html, write_timeline
from .timing import StepWindow, timing_metrics
from .trace import TraceFile, read_trace
from .transcripts import GroupTranscript, TranscriptWriter, datum_json, iteration_dir, token_ids

__all__ = [
    "Activity",
    "ActivitySeen",
    "GroupTranscript",
    "ObserveSettings",
    "RunObserver",
    "SpanRecord",
    "StallSnapshot",
    "StallWatch",
    "StepSeen",
    "StepWindow",
    "TraceFile",
    "TranscriptWriter",
    "Watch",
    "activity",
    "current_watch",
    "datum_json",
    "format_stall_report",
    "format_task_tree",
    "iteration_dir",
    "on_free_lane",
    "on_track",
    "read_trace",
    "span",
    "timeline_html",
    "timing_metrics",
    "token_ids",
    "watching",
    "write_timeline",
]
