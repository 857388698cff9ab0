"""A run on the command line: ``trio.run`` with progress, sinks and a clean Ctrl-C; an example's ``main``."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import trio

from ..backends.protocol import Backend
from ..config import Config
from ..errors import ConfigError
from ..loop.evaluation import SamplingClientEvaluator
from ..loop.gc_policy import tune_gc_for_training
from ..loop.train import RunHandle, train
from ..sinks import MetricsSink, close_sinks, open_sinks
from ..types import RLDataset
from .backend import LazyTokenizer, make_backend
from .flags import A, make_config, parse_args
from .progress import RunProgress
from .reporting import RunEnding, config_error_leaves, report
from .signals import (
    EXIT_CONFIG_ERROR,
    hand_signals_to_trio,
    ignore_stop_signals_until_reported,
    restore_stop_signals,
    watch_for_stop_signals,
)


@dataclass
class _Watchers:
    """Everything that reads the live records: the progress bar and the sinks."""

    progress: RunProgress | None
    sinks: Sequence[MetricsSink]

    def show(self, record: dict[str, Any]) -> None:
        if self.progress is not None:
            self.progress.update(record)
        for sink in self.sinks:
            sink.write(record)


@dataclass
class _Run:
    """What :func:`trio_rl.train` takes besides the configuration."""

    dataset: RLDataset
    backend: Backend
    evaluators: Sequence[SamplingClientEvaluator]


async def _run(config: Config, run: _Run, watchers: _Watchers, ending: RunEnding, out: IO[str]) -> None:
    run_scope = trio.CancelScope()

    async def train_into_ending(*, task_status: trio.TaskStatus[RunHandle] = trio.TASK_STATUS_IGNORED) -> None:
        ending.result = await train(
            config, dataset=run.dataset, backend=run.backend, evaluators=run.evaluators, task_status=task_status
        )

    handle: RunHandle | None = None
    async with trio.open_nursery() as outer:
        await outer.start(watch_for_stop_signals, run_scope, ending.stop, out)
        # The backend is entered outside the run's scope: a cancelled run still
        # needs the backend's workers to save its last step.
        async with run.backend:
            with run_scope:
                async with trio.open_nursery() as run_nursery:
                    started: RunHandle = await run_nursery.start(train_into_ending)
                    handle = started
                    async for record in started.metrics:
                        watchers.show(record)
        outer.cancel_scope.cancel()
    # A cancelled run still releases its last records when it ends: the sinks get
    # them too, so they hold what metrics.jsonl holds.
    while handle is not None:
        try:
            watchers.show(handle.metrics.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            break


@dataclass(frozen=True, kw_only=True)
class Reporting:
    """How a command-line run reports (:func:`run_cli`'s ``reporting``).

    Attributes:
        curve_keys: evaluation metrics shown in the progress and plotted beside the reward.
        progress: show progress on ``out``.
        progress_every: steps per progress line off a terminal.
        sinks: receive every record of ``metrics.jsonl``, in the same order; closed at the end.
        out: where progress and messages go (default: stderr).
        debug: print the whole traceback of a failure (also with ``TRIO_RL_DEBUG=1``).
    """

    curve_keys: Sequence[str] = ()
    progress: bool = True
    progress_every: int = 10
    sinks: Sequence[MetricsSink] = ()
    out: IO[str] | None = None
    debug: bool = False


def run_cli(
    config: Config,
    *,
    dataset: RLDataset,
    backend: Backend,
    evaluators: Sequence[SamplingClientEvaluator] = (),
    reporting: Reporting | None = None,
) -> int:
    """Train under ``trio.run`` with progress, sinks and a clean Ctrl-C; return the exit code.

    Args:
        config: the run's configuration.
        dataset, backend, evaluators: as for :func:`trio_rl.train`; ``backend`` not yet entered.
        reporting: progress, sinks, where messages go and how much of a failure to print
            (:class:`Reporting`; default: progress on stderr, no sinks).

    Returns:
        0 when the run finished, 130 when Ctrl-C stopped it (143 for SIGTERM), 2 for an
        invalid configuration, 1 when the run failed.
    """
    reporting = reporting or Reporting()
    curve_keys, sinks = reporting.curve_keys, reporting.sinks
    stream: IO[str] = reporting.out if reporting.out is not None else sys.stderr
    bar = (
        RunProgress(stream, config.max_steps, eval_keys=curve_keys, every=reporting.progress_every)
        if reporting.progress
        else None
    )
    ending = RunEnding()
    hand_signals_to_trio()
    # The command line owns its process, so it may set the collector's policy.
    tune_gc_for_training()
    try:
        trio.run(_run, config, _Run(dataset, backend, evaluators), _Watchers(bar, sinks), ending, stream)
    except* KeyboardInterrupt:
        # Ctrl-C before the watcher was listening.
        ending.stop.stopped_by = ending.stop.stopped_by or signal.SIGINT
    except* ConfigError as group:
        ending.config_errors = config_error_leaves(group)
    except* Exception as group:
        ending.failures = group
    finally:
        ignore_stop_signals_until_reported()
        if bar is not None:
            bar.close()
        close_sinks(sinks)
    try:
        return report(ending, Path(config.log_path), curve_keys, stream, reporting.debug)
    finally:
        restore_stop_signals()


@dataclass
class Experiment:
    """What an example builds from its flags: the data, the evaluators, and what to plot.

    Attributes:
        dataset: the run's dataset.
        evaluators: evaluators of the weights.
        curve_keys: evaluation metrics to show in the progress and plot beside the reward.
        config_overrides: :class:`Config` fields the example sets itself.
    """

    dataset: RLDataset
    evaluators: Sequence[SamplingClientEvaluator] = ()
    curve_keys: Sequence[str] = ()
    config_overrides: dict[str, Any] = field(default_factory=lambda: {})


def run_example(
    cls: type[A],
    build: Callable[[A, LazyTokenizer], Experiment],
    argv: Sequence[str] | None = None,
    *,
    alphabet: str,
    description: str = "",
    out: IO[str] | None = None,
    **defaults: Any,
) -> int:
    """An example's ``main``: flags, backend, ``build``, a checked config, then :func:`run_cli`.

    Args:
        cls: the example's flags.
        build: makes the example's :class:`Experiment` from the flags and the tokenizer.
        argv, description, defaults: as for :func:`~trio_rl.cli.parse_args`.
        alphabet: the local backend's characters.
        out: where messages go (default: stderr).

    Returns:
        The exit code: 0 done, 2 invalid configuration (its message printed), 130 Ctrl-C.
    """
    stream: IO[str] = out if out is not None else sys.stderr
    args = parse_args(cls, argv, description=description, **defaults)
    try:
        backend, tokenizer = make_backend(args, alphabet=alphabet)
        experiment = build(args, tokenizer)
        config = make_config(args, **experiment.config_overrides)
        # Fail before any work (or a sink's run) starts; dataset-dependent checks come from train().
        config.validate()
        sinks = open_sinks(
            args.log_to,
            Path(config.log_path),
            config=config.to_json(),
            wandb_project=args.wandb_project,
            wandb_mode=args.wandb_mode,
        )
    except ConfigError as error:
        stream.write(f"error: {error}\n")
        return EXIT_CONFIG_ERROR
    return run_cli(
        config,
        dataset=experiment.dataset,
        backend=backend,
        evaluators=experiment.evaluators,
        reporting=Reporting(
            curve_keys=experiment.curve_keys,
            progress=args.progress,
            progress_every=args.progress_every,
            sinks=sinks,
            out=stream,
            debug=args.debug,
        ),
    )
