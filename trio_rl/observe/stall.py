"""The stall report: what a run that has stopped making progress is waiting for.

When no step has finished for ``Config.stall_warning_s`` seconds (Trio's
clock), :class:`StallWatch` logs one warning with the report, and repeats it
every ``stall_warning_s`` for as long as the run stays stuck (tinker-cookbook PR
#822 warns every 120 s the same way). The command line prints the same report on
``SIGUSR1``. It names:

- every group being rolled out, with its age, attempt and what it is waiting on
  (the spans its tasks are suspended inside: ``sample``, ``env_step``,
  ``compute_group_rewards``..., read from their frames by :mod:`trio_rl.observe.waits`);
- what the trainer and the dataloader are waiting on;
- the statistics of the run's own primitives (weights, admission gate, ledger);
- the Trio task tree, with where each task is suspended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

logger = logging.getLogger("trio_rl.observe")

STAGES = ("trainer", "dataloader", "evaluator")
"""Activities that are stages of the run rather than groups."""


@dataclass(frozen=True)
class ActivitySeen:
    """One activity as a report sees it: a group being rolled out, or a stage.

    Attributes:
        what: how the report names it (``group 3/1`` or ``trainer``).
        started: when it began (Trio's clock).
        attempt: the group's attempt (0 unless it was resampled).
        waiting: the spans its tasks are suspended inside, by name, and how many tasks wait in each.
    """

    what: str
    started: float
    attempt: int = 0
    waiting: Mapping[str, int] = field(default_factory=dict[str, int])

    def waits(self) -> str:
        """What it waits on (``2 x sample, 1 x env_step``), or that no task of it waits inside a span."""
        open_ = [f"{n} x {name}" for name, n in self.waiting.items()]
        return ", ".join(open_) if open_ else "nothing timed (between spans)"


@dataclass(frozen=True)
class StallSnapshot:
    """What a stall report says, taken at one instant.

    Attributes:
        now: Trio's clock.
        last_progress: when the last step finished (or the run started).
        last_step: the newest weights version (-1 before any).
        activities: the open activities: groups being rolled out and the stages.
        outstanding: items handed out and not yet trained or dropped, as ``batch/group``.
        statistics: each primitive's ``statistics()``, by name.
        task_tree: :func:`~trio_rl.observe.task_tree.format_task_tree`'s text.
    """

    now: float
    last_progress: float
    last_step: int
    activities: Sequence[ActivitySeen]
    outstanding: Sequence[str]
    statistics: Mapping[str, Any]
    task_tree: str


def format_stall_report(snapshot: StallSnapshot) -> str:
    """The report's text: a headline, then the groups, the stages, the primitives and the task tree."""
    quiet = snapshot.now - snapshot.last_progress
    groups = sorted((a for a in snapshot.activities if a.what not in STAGES), key=lambda a: a.started)
    stages = {a.what: a for a in snapshot.activities if a.what in STAGES}
    lines = [
        f"no training step has finished for {quiet:.1f} s (newest weights: version {snapshot.last_step}); "
        f"{len(groups)} groups being rolled out"
    ]
    lines.append("groups being rolled out (oldest first):")
    lines.extend(
        f"  {a.what}: age {snapshot.now - a.started:.1f} s, attempt {a.attempt}, waiting on {a.waits()}" for a in groups
    )
    if not groups:
        lines.append("  none")
    for stage in STAGES:
        act = stages.get(stage)
        if act is not None:
            lines.append(f"{stage}: waiting on {act.waits()}")
    shown = ", ".join(snapshot.outstanding[:20]) + (" ..." if len(snapshot.outstanding) > 20 else "")
    lines.append(f"outstanding items, as the trainer last read the ledger: {shown or 'none'}")
    lines.extend(f"{name}: {stats}" for name, stats in snapshot.statistics.items())
    lines.append("Trio task tree:")
    lines.extend("  " + line for line in snapshot.task_tree.splitlines())
    return "\n".join(lines)


class StallWatch:
    """Logs the stall report when no step has finished for ``interval`` seconds, then every ``interval``.

    Args:
        interval: seconds without a finished step before the first warning, and between warnings
            (None: no warnings; :meth:`report_now` still reports).
        snapshot: takes the report's snapshot (given when the last progress was).
        report: where each report's text goes (default: a warning on the ``trio_rl.observe`` logger).
    """

    def __init__(
        self,
        interval: float | None,
        snapshot: Callable[[float], StallSnapshot],
        report: Callable[[str], None] | None = None,
    ) -> None:
        if interval is not None and not interval > 0:
            raise ValueError(f"stall_warning_s must be positive (or None to turn the report off), not {interval}")
        self._interval = interval
        self._snapshot = snapshot
        self._report = report if report is not None else logger.warning
        self._last_progress = trio.current_time()
        self.reports = 0
        """How many reports it has made."""

    def progressed(self) -> None:
        """A step finished: the quiet time starts again."""
        self._last_progress = trio.current_time()

    def report_now(self) -> str:
        """The report's text as of now (for ``SIGUSR1``)."""
        return format_stall_report(self._snapshot(self._last_progress))

    async def run(self) -> None:
        """Watch until cancelled (return at once when there is no interval)."""
        if self._interval is None:
            return
        interval = self._interval
        warned_at: float | None = None
        while True:
            quiet_since = self._last_progress
            due = quiet_since + interval
            if warned_at is not None and warned_at >= quiet_since:
                due = warned_at + interval
            await trio.sleep_until(due)
            if self._last_progress != quiet_since:
                warned_at = None
                continue
            warned_at = trio.current_time()
            self.reports += 1
            self._report(self.report_now())
