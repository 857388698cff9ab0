"""Ctrl-C and SIGTERM on the command line, and the exit codes a run ends with.

The first Ctrl-C (or SIGTERM) cancels the run, whose trainer then saves its last
completed step (``Config.save_on_cancel``); the third quits at once, unsaved. A run
stopped this way exits with 130 (143 for SIGTERM), as shells report such a program.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import IO

import trio

EXIT_OK = 0
"""The run finished."""
EXIT_CONFIG_ERROR = 2
"""What argparse (and so tyro) exits with for a bad flag; an invalid configuration uses it too."""
EXIT_INTERRUPTED = 130
"""128 + SIGINT, what shells report for a program stopped by Ctrl-C."""
EXIT_TERMINATED = 143
"""128 + SIGTERM: a run stopped by ``kill`` (or a job scheduler) ends like one stopped by Ctrl-C."""
EXIT_ERROR = 1
"""The run failed: one line per error, the full traceback in ``error.log`` in the run folder."""

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""The signals that stop a run cleanly: Ctrl-C and ``kill``."""
_EARLY_SIGNALS: list[int] = []
"""SIGTERMs that arrived after trio.run began but before the watcher listened (see hand_signals_to_trio)."""


@dataclass
class StopRequest:
    """Whether a stop signal has stopped the run: the first one received, and how many came."""

    stopped_by: int | None = None
    presses: int = 0

    @property
    def interrupted(self) -> bool:
        """Whether a signal stopped the run."""
        return self.stopped_by is not None

    @property
    def exit_code(self) -> int:
        """130 for Ctrl-C, 143 for SIGTERM."""
        return EXIT_TERMINATED if self.stopped_by == signal.SIGTERM else EXIT_INTERRUPTED


async def _chain(first: list[int], then: AsyncIterator[int]) -> AsyncIterator[int]:
    while first:
        yield first.pop(0)
    async for signum in then:
        yield signum


async def watch_for_stop_signals(
    run_scope: trio.CancelScope,
    stop: StopRequest,
    out: IO[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Ctrl-C (or SIGTERM) cancels ``run_scope``, which saves its last completed step; the third quits unsaved.

    The receiver stays open for the whole run, so no press can ever land as a
    ``KeyboardInterrupt`` inside the shielded save.

    Args:
        run_scope: the run's cancel scope.
        stop: records the signals received.
        out: where the one-line notices go.
        task_status: started once the receiver listens.
    """
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        task_status.started()
        async for signum in _chain(_EARLY_SIGNALS, signals):
            stop.presses += 1
            if stop.stopped_by is None:
                stop.stopped_by = signum
                out.write(
                    "\ninterrupted: saving the last completed step (press Ctrl-C twice more to quit without saving)\n"
                )
                run_scope.cancel()
            elif stop.presses == 2:
                out.write("still saving the last completed step; Ctrl-C once more quits without saving\n")
            else:
                # Everything on disk is whole: a state being saved is not yet in
                # checkpoints.jsonl, so a resume takes the checkpoint before it.
                out.write("quitting without saving; --resume continues from the last recorded checkpoint\n")
                out.flush()
                os._exit(stop.exit_code)
            out.flush()


REPORT_SIGNAL = getattr(signal, "SIGUSR1", None)
"""The signal that prints the stall report (``kill -USR1 <pid>``); None where the platform has none."""


async def print_reports_on_signal(
    report: Callable[[], str], out: IO[str], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Each ``SIGUSR1`` writes ``report()`` (the run's stall report) to ``out``; the run goes on.

    So a run that seems stuck can be asked what it waits on without being killed.
    Returns at once where there is no ``SIGUSR1`` (Windows).

    Args:
        report: makes the report's text.
        out: where it goes (the terminal's stderr).
        task_status: started once the receiver listens.
    """
    if REPORT_SIGNAL is None:
        task_status.started()
        return
    with trio.open_signal_receiver(REPORT_SIGNAL) as signals:
        task_status.started()
        async for _ in signals:
            out.write("\n" + report() + "\n")
            out.flush()


def exit_quietly_on_stop_signals() -> None:
    """Until the run starts, make Ctrl-C exit with 130 and SIGTERM with 143, without a traceback.

    Call it first thing in a script, before the slow imports (torch takes seconds);
    :func:`~trio_rl.cli.run_cli` takes the signals over for the run itself. The
    process ends at once, without unwinding: nothing has started that needs saving.
    """
    # Raising SystemExit instead can land inside the import machinery (a weakref
    # callback of its module locks), where Python prints "Exception ignored" and
    # goes on, and the next import can then wait forever on a lock left held.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, lambda signum, frame: os._exit(EXIT_INTERRUPTED))
        signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(EXIT_TERMINATED))


def hand_signals_to_trio() -> None:
    """Before ``trio.run``: Ctrl-C becomes Trio's ``KeyboardInterrupt``, an early SIGTERM is only noted."""
    # Trio turns SIGINT into a KeyboardInterrupt at a safe point only when it
    # finds Python's default handler; a SIGTERM that lands before the watcher
    # listens must not raise inside Trio's scheduler.
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: _EARLY_SIGNALS.append(signum))


def ignore_stop_signals_until_reported() -> None:
    """After ``trio.run``: ignore stop signals while the last line is written."""
    # The save is done (or abandoned); what is left takes a moment (the curve,
    # one line), and a press now must not cut that line off.
    if threading.current_thread() is not threading.main_thread():
        return
    _EARLY_SIGNALS.clear()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def restore_stop_signals() -> None:
    """Once the run is reported: Python's own handling of Ctrl-C and SIGTERM again."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
