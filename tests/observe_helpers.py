"""Checks shared by the observation tests: a trace's spans are closed and nested, per track."""

from __future__ import annotations

from typing import Any


def complete_spans(events: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """The trace's ``X`` events by thread id, after checking each is closed (a duration) and they nest on each thread."""
    by_tid: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        assert event["ph"] in ("X", "M"), f"only complete and metadata events are written, not {event}"
        if event["ph"] == "X":
            assert event["dur"] >= 0, event
            by_tid.setdefault(event["tid"], []).append(event)
    for spans in by_tid.values():
        assert_nested(spans)
    return by_tid


def assert_nested(spans: list[dict[str, Any]]) -> None:
    """Spans of one thread either nest or are disjoint (a stack of open spans, sorted by start)."""
    stack: list[tuple[float, dict[str, Any]]] = []
    # Microsecond rounding may put a child's end a hair past its parent's.
    eps = 0.002
    for span in sorted(spans, key=lambda s: (s["ts"], -s["dur"])):
        end = span["ts"] + span["dur"]
        while stack and stack[-1][0] <= span["ts"] + eps:
            stack.pop()
        if stack:
            assert end <= stack[-1][0] + eps, f"{span} overlaps {stack[-1][1]} without nesting in it"
        stack.append((end, span))


def thread_names(events: list[dict[str, Any]]) -> dict[int, str]:
    """Thread id to track name, from the trace's ``M`` events."""
    return {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
