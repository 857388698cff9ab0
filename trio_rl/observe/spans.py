"""Spans: the one hook the stages call around each thing worth timing or waiting on.

A stage writes ``with span("wait_for_weights"):`` around a wait. What that
costs depends on what the run records:

- no trace and no timelines (the default): one context-variable read, and a
  shared do-nothing context manager. The stall report still names the open
  spans, which it reads from the waiting tasks' frames
  (:mod:`trio_rl.observe.waits`);
- a trace or timelines: the span's start and end (Trio's clock, so virtual
  time in tests) are recorded on the current track.

Tracks are named, not numbered by task: a rollout worker's group, and each env
rollout of it, get tracks of their own (:func:`on_track`), so spans on one track
are always one task's and nest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import trio


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One closed span.

    Attributes:
        name: what was timed (``sample``, ``env_step``, ``forward_backward``...).
        track: where it ran (``trainer``, ``worker 3``, ``worker 3 env 1``...).
        start, end: Trio's clock, in seconds.
        args: small JSON-able details (the group, the step).
    """

    name: str
    track: str
    start: float
    end: float
    args: dict[str, Any]


class Activity:
    """Something a stall report names: a group being rolled out, the trainer, the dataloader.

    What it waits on is not counted as it runs (that would cost every span, in
    every run): the report reads it from the frames of the tasks that belong
    to it (:mod:`trio_rl.observe.waits`).

    Attributes:
        what: how the report names it (``group 3/1`` or ``trainer``).
        started: when it began (Trio's clock).
        attempt: the group's attempt (0 unless it was resampled).
    """

    __slots__ = ("attempt", "started", "what")

    def __init__(self, what: str, started: float, attempt: int = 0) -> None:
        self.what, self.started, self.attempt = what, started, attempt

    def __repr__(self) -> str:
        return f"Activity({self.what!r}, started={self.started}, attempt={self.attempt})"


class Watch:
    """What one run watches: the open activities, and where closed spans go (None: no trace).

    Args:
        on_span: called with every closed span, or None when nothing is traced.
    """

    def __init__(self, on_span: Callable[[SpanRecord], None] | None = None) -> None:
        self.on_span = on_span
        self.transcripts = False
        """Whether rollout workers capture their groups' transcripts."""
        self.activities: dict[int, Activity] = {}
        self.lanes: dict[str, set[int]] = {}
        """Per track, the lane numbers in use under it (:func:`on_free_lane`)."""

    def activity(self, what: str, *, attempt: int = 0) -> contextlib.AbstractContextManager[Activity]:
        """Open an activity for the current task (and the tasks it starts from here on) until the block ends."""
        return _Opened(self.activities, Activity(what, trio.current_time(), attempt))


class _Opened:
    """An activity open on a watch for one block (a class: one is opened per group)."""

    __slots__ = ("_act", "_open", "_token")

    def __init__(self, open_: dict[int, Activity], act: Activity) -> None:
        self._open, self._act = open_, act

    def __enter__(self) -> Activity:
        self._open[id(self._act)] = self._act
        self._token = _activity.set(self._act)
        return self._act

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _activity.reset(self._token)
        del self._open[id(self._act)]


_watch: ContextVar[Watch | None] = ContextVar("trio_rl_watch", default=None)
_activity: ContextVar[Activity | None] = ContextVar("trio_rl_activity", default=None)
_track: ContextVar[str] = ContextVar("trio_rl_track", default="run")


class _Span:
    __slots__ = ("_args", "_name", "_on_span", "_start")

    def __init__(self, name: str, on_span: Callable[[SpanRecord], None], args: dict[str, Any]) -> None:
        self._name, self._on_span, self._args = name, on_span, args
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = trio.current_time()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # Closed on the way out of a crash or a cancellation too: a trace has no open span.
        self._on_span(SpanRecord(self._name, _track.get(), self._start, trio.current_time(), self._args))


_NOTHING = contextlib.nullcontext()


def span(name: str, **args: Any) -> contextlib.AbstractContextManager[None]:
    """Time ``name`` as far as the run records spans; a stall report names it as what its task waits on.

    Where nothing is recorded this is one context-variable read and a shared
    do-nothing context manager: the stall report finds the open spans in the
    waiting tasks' frames (:mod:`trio_rl.observe.waits`), so a span need not
    announce itself. Per-rollout calls (each sample and env step) are not
    spans in the code at all: :mod:`trio_rl.observe.timed_calls` wraps them
    only when spans are recorded.

    Args:
        name: the span's name; where tinker-cookbook 0.6.1 times the same thing,
            its scope's name (``sample``, ``forward_backward``, ``train_step``...).
            Give it as a string literal: the stall report reads it from the source.
        args: details recorded with it in a trace.

    Returns:
        A context manager; a shared one that does nothing unless spans are recorded.
    """
    watch = _watch.get()
    if watch is None or watch.on_span is None:
        return _NOTHING
    return _Span(name, watch.on_span, args)


def recording_spans() -> bool:
    """Whether the current run records spans (a trace or timelines): only then are per-call spans worth making."""
    watch = _watch.get()
    return watch is not None and watch.on_span is not None


@contextlib.contextmanager
def on_track(track: str) -> Iterator[None]:
    """Record the spans of this block (and of the tasks it starts) on ``track``."""
    token = _track.set(track)
    try:
        yield
    finally:
        _track.reset(token)


class _Lane:
    __slots__ = ("_kind", "_lane", "_taken", "_token")

    def __init__(self, lanes: dict[str, set[int]], kind: str) -> None:
        self._taken, self._kind = lanes, kind

    def __enter__(self) -> None:
        parent = _track.get()
        taken = self._taken.setdefault(parent, set())
        lane = 0
        while lane in taken:
            lane += 1
        taken.add(lane)
        self._lane = (parent, lane)
        self._token = _track.set(f"{parent} {self._kind} {lane}")

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _track.reset(self._token)
        parent, lane = self._lane
        self._taken[parent].discard(lane)


def on_free_lane(kind: str) -> contextlib.AbstractContextManager[None]:
    """Record this block's spans on the lowest-numbered lane under the current track that no other block holds.

    Concurrent rollouts of a group each get a lane of their own (``worker 3
    rollout 0``, ``worker 3 rollout 1``...), and a retry takes a lane freed by
    the attempt before it, so spans on one lane never overlap. Nothing is done
    unless spans are recorded.
    """
    watch = _watch.get()
    if watch is None or watch.on_span is None:
        return _NOTHING
    return _Lane(watch.lanes, kind)


def activity_of_task(task: trio.lowlevel.Task) -> Activity | None:
    """The activity ``task`` belongs to now: the one open in its context (what it inherited, or opened itself)."""
    return task.context.get(_activity)


def current_track() -> str:
    """The track spans are recorded on here."""
    return _track.get()


def current_watch() -> Watch | None:
    """The run's :class:`Watch`, inside :func:`watching`; else None."""
    return _watch.get()


def activity(what: str, *, attempt: int = 0) -> contextlib.AbstractContextManager[Activity | None]:
    """Open an activity on the run's :class:`Watch` (nothing outside :func:`watching`)."""
    watch = _watch.get()
    if watch is None:
        return contextlib.nullcontext()
    return watch.activity(what, attempt=attempt)


@contextlib.contextmanager
def watching(watch: Watch) -> Iterator[Watch]:
    """Make ``watch`` the run's for this block and the tasks started in it."""
    token = _watch.set(watch)
    try:
        yield watch
    finally:
        _watch.reset(token)
