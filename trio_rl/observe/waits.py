"""What each activity of a run waits on, read from its tasks' frames when a report asks.

A stall report names, for every group being rolled out and for the trainer
and the dataloader, the spans their tasks are suspended inside (``2 x sample,
1 x env_step``). Counting spans as they open and close would cost every span
of every run, for a report that most runs never make; so nothing is counted,
and the report reads the open spans off the frames instead, the way a
debugger would:

- a frame suspended inside a ``with span("name"):`` block (the name a string
  literal) is waiting on ``name``; every such block around the frame's line
  counts, outermost first;
- a line may name what it waits on in a ``# waits on: name`` comment, for the
  calls made once per turn of every rollout (the sample and the env step),
  where even a do-nothing span would cost every run. The same calls are timed
  as spans of those names when a trace is on (:mod:`trio_rl.observe.timed_calls`).

A task belongs to the :class:`~trio_rl.observe.spans.Activity` its context
holds (the tasks a group's worker starts inherit the group's), and each name
counts once per task, so a group with two rollouts waiting on the sampler
reads ``2 x sample``.
"""

from __future__ import annotations

import ast
import functools
import linecache
import os
import re
from collections import Counter
from collections.abc import Iterator

import trio

from .spans import Activity, activity_of_task

_TRIO_DIR = os.path.dirname(trio.__file__)
_MARKER = re.compile(r"#\s*waits on:\s*(\w+)")


def waits_by_activity(root: trio.lowlevel.Task | None = None) -> dict[int, Counter[str]]:
    """For each activity (by ``id``) that some task under ``root`` belongs to, the spans its tasks wait inside.

    Args:
        root: where to start (default: the run's root task).

    Returns:
        Counters in the order the names were first met (tasks in tree order,
        each task's frames outermost first).
    """
    root = root if root is not None else trio.lowlevel.current_root_task()
    found: dict[int, Counter[str]] = {}
    if root is None:
        return found
    for task in _tasks(root):
        act: Activity | None = activity_of_task(task)
        if act is None:
            continue
        counter = found.setdefault(id(act), Counter())
        counter.update(dict.fromkeys(suspended_inside(task), 1))
    return found


def suspended_inside(task: trio.lowlevel.Task) -> list[str]:
    """The spans ``task`` is suspended inside, outermost first (a name may repeat)."""
    names: list[str] = []
    for frame, lineno in task.iter_await_frames():
        code = frame.f_code
        if code.co_filename.startswith(_TRIO_DIR):
            continue
        names.extend(names_at(code.co_filename, code.co_firstlineno, lineno))
    return names


def _tasks(task: trio.lowlevel.Task) -> Iterator[trio.lowlevel.Task]:
    yield task
    for nursery in task.child_nurseries:
        for child in sorted(nursery.child_tasks, key=lambda t: t.name):
            yield from _tasks(child)


def names_at(filename: str, first_line: int, lineno: int) -> list[str]:
    """The span blocks of the function starting at ``first_line`` that hold ``lineno``, then the line's marker."""
    names = [name for start, end, name in _span_blocks(filename) if first_line <= start <= lineno <= end]
    marker = _MARKER.search(linecache.getline(filename, lineno))
    if marker is not None:
        names.append(marker.group(1))
    return names


@functools.cache
def _span_blocks(filename: str) -> tuple[tuple[int, int, str], ...]:
    """Every ``with span("name")`` block of a source file, as ``(first line, last line, name)``, outermost first."""
    source = "".join(linecache.getlines(filename))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ()
    blocks: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.With | ast.AsyncWith):
            continue
        for item in node.items:
            name = _span_name(item.context_expr)
            if name is not None:
                blocks.append((node.lineno, node.end_lineno or node.lineno, name))
    # ast.walk is breadth-first: sorting by start line (and longest first) puts outer blocks before inner.
    return tuple(sorted(blocks, key=lambda b: (b[0], -b[1])))


def _span_name(expr: ast.expr) -> str | None:
    """``name`` for ``span("name", ...)`` (called by that name or as an attribute), else None."""
    if not isinstance(expr, ast.Call) or not expr.args:
        return None
    func = expr.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    first = expr.args[0]
    if called != "span" or not isinstance(first, ast.Constant) or not isinstance(first.value, str):
        return None
    return first.value
