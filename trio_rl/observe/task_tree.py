"""The Trio task tree: every task of the run, nested as its nurseries nest, and where each is blocked."""

from __future__ import annotations

import os

import trio


def format_task_tree(root: trio.lowlevel.Task | None = None) -> str:
    """One line per task under ``root`` (default: the run's root task), indented by depth.

    Each line names the task and the innermost frame it is suspended in
    (function, file and line), from ``Task.iter_await_frames``; the task that
    calls this is marked as running.
    """
    root = root if root is not None else trio.lowlevel.current_root_task()
    if root is None:
        return "(not inside trio.run)"
    me = trio.lowlevel.current_task()
    lines: list[str] = []
    _walk(root, 0, me, lines)
    return "\n".join(lines)


def _walk(task: trio.lowlevel.Task, depth: int, me: trio.lowlevel.Task, lines: list[str]) -> None:
    lines.append(f"{'  ' * depth}{_short(task.name)}: {'running (this report)' if task is me else _where(task)}")
    for nursery in task.child_nurseries:
        for child in sorted(nursery.child_tasks, key=lambda t: t.name):
            _walk(child, depth + 1, me, lines)


_TRIO_DIR = os.path.dirname(trio.__file__)


def _where(task: trio.lowlevel.Task) -> str:
    """The innermost frame outside Trio itself, and the Trio function it waits in."""
    ours: tuple[str, str, int] | None = None
    trio_call: str | None = None
    for frame, lineno in task.iter_await_frames():
        code = frame.f_code
        if code.co_filename.startswith(_TRIO_DIR):
            trio_call = trio_call or code.co_qualname
        else:
            ours, trio_call = (code.co_qualname, code.co_filename, lineno), None
    if ours is None:
        return "waiting in trio" + (f" ({trio_call})" if trio_call else "")
    name, filename, lineno = ours
    inside = f", in trio's {trio_call}" if trio_call else ""
    return f"waiting in {name} ({os.path.basename(filename)}:{lineno}){inside}"


def _short(name: str) -> str:
    # Trio names a task by its function's module and name; the module path adds nothing here.
    return name.removeprefix("trio_rl.")
