"""Experiment logging: one small interface, several sinks, the same records in the same order.

A record is one line of ``metrics.jsonl``: ``{"step": n, "<metric>": value, ...}``, written
the moment it is made (see :class:`trio_rl.loop.metrics_log.MetricsLog`): a training step's record when
the step ends, an evaluation's when the evaluation ends, under the step whose weights it
evaluated, so an evaluation's record may come after later steps' records.
Every sink receives exactly those records, in the order they are written:

- :class:`JsonlSink` writes ``metrics.jsonl``; :func:`trio_rl.train` always uses it.
- :class:`TensorBoardSink` writes a TensorBoard event file (extra ``tensorboard``).
- :class:`WandbSink` logs to Weights & Biases (extra ``wandb``); offline by default, so
  it works without a network and ``wandb sync`` uploads the run later.

The command line feeds the optional sinks from :attr:`trio_rl.RunHandle.metrics`
(``--log-to tensorboard wandb``); a program embedding :func:`trio_rl.train` can do
the same with :func:`open_sinks`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from .base.jsonl import open_for_append
from .errors import ConfigError

SinkName = Literal["tensorboard", "wandb"]
"""The optional sinks, by the name ``--log-to`` takes."""

STEP = "step"
"""The key of a record's step; W&B plots every metric against it."""

TENSORBOARD_DIR = "tensorboard"
"""Subfolder of the run folder holding the TensorBoard event files."""


class MetricsSink(Protocol):
    """Receives every record of a run, in the order metrics.jsonl has them."""

    def write(self, record: Mapping[str, Any]) -> None:
        """Log one record; ``record["step"]`` is its step."""
        ...

    def close(self) -> None:
        """Flush and release whatever the sink holds; called once, at the end of the run."""
        ...


def json_value(value: Any) -> Any:
    """``value`` as strict JSON allows it: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers of a record other than its step: what a dashboard can plot."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            out[key] = float(value)
    return out


class JsonlSink:
    """Appends each record as one JSON line and flushes, so a crash loses nothing written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open_for_append(path)

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one line."""
        self._file.write(json.dumps({k: json_value(v) for k, v in record.items()}) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class TensorBoardSink:
    """One scalar per metric and step, in ``<log_path>/tensorboard``.

    Written with tensorboardX, which needs neither torch nor TensorFlow.
    """

    def __init__(self, log_dir: Path) -> None:
        try:
            from tensorboardX import SummaryWriter
        except ImportError as error:
            raise ConfigError("log_to", "tensorboard needs its extra: pip install 'trio_rl[tensorboard]'") from error
        self.log_dir = log_dir
        self._writer = SummaryWriter(logdir=str(log_dir))

    def write(self, record: Mapping[str, Any]) -> None:
        """Add every scalar of ``record`` at its step."""
        step = int(record["step"])
        for key, value in scalars(record).items():
            self._writer.add_scalar(key, value, global_step=step)  # pyright: ignore[reportUnknownMemberType]

    def close(self) -> None:
        """Flush the event file and close it."""
        self._writer.close()


class WandbSink:
    """A Weights & Biases run; ``mode="offline"`` writes it under ``<log_path>/wandb`` without a network."""

    def __init__(
        self, log_path: Path, *, project: str, mode: Literal["offline", "online"], config: Mapping[str, Any]
    ) -> None:
        try:
            import wandb
        except ImportError as error:
            raise ConfigError("log_to", "wandb needs its extra: pip install 'trio_rl[wandb]'") from error
        self._run = wandb.init(
            project=project,
            dir=str(log_path),
            mode=mode,
            config=dict(config),
            name=log_path.name,
            # Our Ctrl-C handling and exit codes stay ours: no console capture, no atexit hooks of wandb's.
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run_dir = Path(self._run.dir).parent
        # An evaluation's record arrives after later training steps' records, and W&B's own
        # step must only grow: so every metric is plotted against our "step" instead.
        self._run.define_metric(STEP)
        self._run.define_metric("*", step_metric=STEP)

    def write(self, record: Mapping[str, Any]) -> None:
        """Log every scalar of ``record`` with its step."""
        self._run.log({STEP: int(record["step"]), **scalars(record)})

    def close(self) -> None:
        """Finish the run and wait until W&B's service has written all of it (offline: to disk)."""
        import wandb

        self._run.finish()
        # finish() can return before the wandb-core process has flushed the run's file;
        # teardown waits for that process, which also keeps it from outliving the run.
        wandb.teardown()


def open_sinks(
    names: Sequence[SinkName],
    log_path: Path,
    *,
    config: Mapping[str, Any],
    wandb_project: str = "trio_rl",
    wandb_mode: Literal["offline", "online"] = "offline",
) -> list[MetricsSink]:
    """The optional sinks named by ``--log-to`` (``metrics.jsonl`` is written by the run itself).

    Args:
        names: which sinks, each at most once.
        log_path: the run folder.
        config: the run's configuration as JSON (``Config.to_json()``), recorded by W&B.
        wandb_project, wandb_mode: the W&B project, and whether to upload as the run goes.

    Raises:
        ConfigError: for a sink whose extra is not installed; sinks opened before it are closed.
    """
    sinks: list[MetricsSink] = []
    if names:
        log_path.mkdir(parents=True, exist_ok=True)
    try:
        for name in dict.fromkeys(names):
            if name == "tensorboard":
                sinks.append(TensorBoardSink(log_path / TENSORBOARD_DIR))
            else:
                sinks.append(WandbSink(log_path, project=wandb_project, mode=wandb_mode, config=config))
    except BaseException:
        close_sinks(sinks)
        raise
    return sinks


def close_sinks(sinks: Sequence[MetricsSink]) -> None:
    """Close every sink, even when one of them fails (the first failure is raised afterwards)."""
    failure: BaseException | None = None
    for sink in sinks:
        try:
            sink.close()
        except Exception as error:
            failure = failure or error
    if failure is not None:
        raise failure
