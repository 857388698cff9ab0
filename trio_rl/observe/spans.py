"""Spans: the one hook the stages call around each thing worth timing or waiting on.

A stage writes ``with span("sample"):`` around a sampler call. What that costs
depends on what the run watches:

- nothing watched (outside :func:`trio_rl.train`, or a bare script): one
  context-variable read, and a shared do-nothing context manager;
- the stall report only (the default): the span is counted on the current
  :class:`Activity` (a group being rolled out, the trainer, the dataloader), so
  that a report can say what each is waiting on;
- a trace: the span's start and end (Trio's clock, so virtual time in tests)
  are recorded as well, on the current track.

Tracks are named, not numbered by task: a rollout worker's group, and each env
rollout of it, get tracks of their own (:func:`on_track`), so spans on one track
are always one task's and nest.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
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


@dataclass
class Activity:
    """Something a stall report names: a group being rolled out, the trainer, the dataloader.

    Attributes:
        what: how the report names it (``group 3/1`` or ``trainer``).
        started: when it began (Trio's clock).
        attempt: the group's attempt (0 unless it was sampled again).
        waiting: the spans open on it now, by name, and how many of each.
    """

    what: str
    started: float
    attempt: int = 0
    waiting: dict[str, int] = field(default_factory=dict[str, int])

    def waits(self) -> str:
        """What it waits on, innermost names as counted (``2 x sample, 1 x env_step``), or ``nothing timed``."""
        open_ = [f"{n} x {name}" for name, n in self.waiting.items() if n > 0]
        return ", ".join(open_) if open_ else "nothing timed (between spans)"


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
        self._next = 0
        self.lanes: dict[str, set[int]] = {}
        """Per track, the lane numbers in use under it (:func:`on_free_lane`)."""

    @contextlib.contextmanager
    def activity(self, what: str, *, attempt: int = 0) -> Iterator[Activity]:
        """Open an activity for the current task (and the tasks it starts from here on) until the block ends."""
        act = Activity(what, trio.current_time(), attempt)
        key, self._next = self._next, self._next + 1
        self.activities[key] = act
        token = _activity.set(act)
        try:
            yield act
        finally:
            _activity.reset(token)
            del self.activities[key]


_watch: ContextVar[Watch | None] = ContextVar("trio_rl_watch", default=None)
_activity: ContextVar[Activity | None] = ContextVar("trio_rl_activity", default=None)
_track: ContextVar[str] = ContextVar("trio_rl_track", default="run")


class _Span:
    __slots__ = ("_act", "_args", "_name", "_on_span", "_start")

    def __init__(
        self, name: str, act: Activity | None, on_span: Callable[[SpanRecord], None] | None, args: dict[str, Any]
    ) -> None:
        self._name, self._act, self._on_span, self._args = name, act, on_span, args
        self._start = 0.0

    def __enter__(self) -> None:
        if self._act is not None:
            waiting = self._act.waiting
            waiting[self._name] = waiting.get(self._name, 0) + 1
        if self._on_span is not None:
            self._start = trio.current_time()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._act is not None:
            self._act.waiting[self._name] -= 1
        if self._on_span is not None:
            # Closed on the way out of a crash or a cancellation too: a trace has no open span.
            self._on_span(SpanRecord(self._name, _track.get(), self._start, trio.current_time(), self._args))


_NOTHING = contextlib.nullcontext()


def span(name: str, **args: Any) -> contextlib.AbstractContextManager[None]:
    """Time ``name`` and count it as what the current activity waits on, as far as the run watches.

    Args:
        name: the span's name; where tinker-cookbook 0.6.1 times the same thing,
            its scope's name (``sample``, ``forward_backward``, ``train_step``...).
        args: details recorded with it in a trace.

    Returns:
        A context manager; a shared one that does nothing when nothing is watched.
    """
    watch = _watch.get()
    if watch is None:
        return _NOTHING
    act = _activity.get()
    if act is None and watch.on_span is None:
        return _NOTHING
    return _Span(name, act, watch.on_span, args)


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
