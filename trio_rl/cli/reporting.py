"""How a command-line run ends: one line (or one per error), ``error.log``, and the exit code."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TypeVar

from ..errors import ConfigError
from ..loop.checkpoints import CheckpointLog
from ..loop.train import TrainResult
from .plotting import write_curves
from .progress import REWARD_KEY
from .signals import EXIT_CONFIG_ERROR, EXIT_ERROR, EXIT_OK, StopRequest

ERROR_LOG = "error.log"
"""The file in the run folder that holds the full traceback of a failed run."""
DEBUG_ENV = "TRIO_RL_DEBUG"
"""Set to 1 to print the whole traceback of a failed run (like ``--debug``)."""


@dataclass
class RunEnding:
    """What :func:`~trio_rl.cli.run_cli` learns about the run: its result, a stop signal, or its errors."""

    started: float = field(default_factory=time.monotonic)
    result: TrainResult | None = None
    stop: StopRequest = field(default_factory=StopRequest)
    config_errors: list[ConfigError] = field(default_factory=lambda: [])
    failures: BaseExceptionGroup[Exception] | None = None


def report(ending: RunEnding, log_path: Path, curve_keys: Sequence[str], out: IO[str], debug: bool) -> int:
    """Say how the run ended, in one line (or one per error), and return the exit code.

    Args:
        ending: what happened.
        log_path: the run folder; the curve and ``error.log`` go there.
        curve_keys: evaluation metrics plotted and summarised beside the reward.
        out: where the lines go.
        debug: print the whole traceback of a failure (also with ``TRIO_RL_DEBUG=1``).

    Returns:
        0 done, 2 invalid configuration, 1 failed, 130 (143) stopped by Ctrl-C (SIGTERM).
    """
    if ending.config_errors:
        for error in ending.config_errors:
            out.write(f"error: {error}\n")
        return EXIT_CONFIG_ERROR
    if ending.failures is not None:
        return _report_failure(ending.failures, log_path, out, debug or os.environ.get(DEBUG_ENV) == "1")
    curve = write_curves(log_path, curve_keys)
    checkpoint = CheckpointLog(log_path).last()
    elapsed = _clock(time.monotonic() - ending.started)
    if ending.stop.interrupted or ending.result is None:
        where = (
            f"checkpoint of step {checkpoint.step} at {checkpoint.state_path} (resume with --resume)"
            if checkpoint is not None
            else "no checkpoint was saved"
        )
        out.write(f"stopped after {elapsed}: {where}\n")
        out.flush()
        return ending.stop.exit_code
    summary = _summary(ending.result, elapsed, curve_keys)
    if checkpoint is not None:
        summary.append(f"checkpoint {checkpoint.state_path}")
    if curve is not None:
        summary.append(f"curve {curve}")
    out.write("; ".join(summary) + "\n")
    out.flush()
    return EXIT_OK


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}:{secs:02d}"


def _summary(result: TrainResult, elapsed: str, curve_keys: Sequence[str]) -> list[str]:
    summary = [f"done: {result.final_step} steps in {elapsed}"]
    records = result.metrics
    steps = [r for r in records if "progress/groups" in r]
    if steps and isinstance(steps[-1].get(REWARD_KEY), float):
        summary.append(f"last reward {steps[-1][REWARD_KEY]:.3f}")
    # The final weights' record merges the end-of-run accounting and their evaluation.
    final = records[-1] if records else {}
    for key in curve_keys:
        value = final.get(key)
        if isinstance(value, (int, float)):
            summary.append(f"final {key} {value:.3f}")
    return summary


def _report_failure(failures: BaseExceptionGroup[Exception], log_path: Path, out: IO[str], debug: bool) -> int:
    """One line per distinct error, the traceback written to ``error.log``; return :data:`EXIT_ERROR`."""
    text = "".join(traceback.format_exception(failures))
    log = log_path / ERROR_LOG
    try:
        log.write_text(text)
        where = f"full traceback in {log}"
    except OSError:
        where = "the traceback could not be written; rerun with --debug to see it"
    for error in distinct_leaves(failures):
        out.write(f"error: {type(error).__name__}: {error}\n")
    out.write(f"{where}\n")
    if debug:
        out.write(text)
    out.flush()
    return EXIT_ERROR


E = TypeVar("E", bound=Exception)


def distinct_leaves(group: BaseExceptionGroup[E]) -> list[E]:
    """The leaves of a (possibly nested) group, each exception object once.

    A nursery wraps the error of a nested nursery again, so one error can arrive
    nested, and one fault shared by many waiters arrives as the same object many times.
    """
    leaves: list[E] = []
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            leaves += distinct_leaves(error)  # pyright: ignore[reportUnknownArgumentType]
        elif not any(error is seen for seen in leaves):
            leaves.append(error)
    return leaves


config_error_leaves = distinct_leaves
"""The leaves of a (possibly nested) group of configuration errors, each once: what a host that caught
``except* ConfigError`` prints."""
