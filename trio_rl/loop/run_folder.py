"""A run folder belongs to one run: claiming it, and resuming from what a crash left in it.

The files trio_rl writes there are ``metrics.jsonl`` (one training record per
step, evaluation and end-of-run records beside them), ``checkpoints.jsonl``
(one record per saved state) and ``config.json``. A backend may keep its own
files in the same folder (``LocalBackend`` its checkpoints).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from ..backends.protocol import Backend, TrainingClient
from ..base.jsonl import DamagedFileError, RunFolderWarning, read_records, rewrite_records
from ..config import Config
from ..errors import ConfigError, DatasetTooShortError
from .checkpoints import CheckpointLog, CheckpointRecord
from .work import ItemKey

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
RUN_FILES = (METRICS_FILE, "checkpoints.jsonl", CONFIG_FILE)
"""The files that mark a folder as holding a run."""


class RunFolderExistsError(ConfigError):
    """``log_path`` already holds a run, and the configuration says neither resume nor overwrite."""


class ResumeError(RuntimeError):
    """No checkpoint recorded in the run folder could be loaded."""


def claim(config: Config, *, dataset_length: int) -> None:
    """Make ``config.log_path`` this run's folder, before any work starts.

    Args:
        config: the run's configuration.
        dataset_length: the batches of the run's dataset, which a resumed
            run's checkpoints must not have gone past.

    Raises:
        RunFolderExistsError: the folder holds a run, and neither ``resume`` nor
            ``overwrite`` is set; the message names the choices.
        DatasetTooShortError: resuming, a checkpoint continues the dataset past
            its end; nothing in the folder was changed.
    """
    log_path = Path(config.log_path)
    # Synchronous on purpose: a local mkdir is instant, and a thread would stall
    # a virtual clock (a thread in flight does not count as activity).
    log_path.mkdir(parents=True, exist_ok=True)
    found = [name for name in RUN_FILES if (log_path / name).exists()]
    if config.resume:
        _check_dataset_covers_checkpoints(CheckpointLog(log_path), dataset_length)
    if not found or config.resume:
        return
    if not config.overwrite:
        raise RunFolderExistsError(
            "log_path",
            f"{log_path} already holds a run ({', '.join(found)}); resume it (resume=True, --resume), "
            "choose another log_path, or replace it (overwrite=True, --overwrite)",
        )
    for name in found:
        (log_path / name).unlink()


def _check_dataset_covers_checkpoints(checkpoints: CheckpointLog, dataset_length: int) -> None:
    """Raise :class:`DatasetTooShortError` if a checkpoint's cursor or owed items lie past the dataset's end.

    Every checkpoint is checked, not only the one that will load: a run that got
    that far was not run on this dataset. The newest at fault is named.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RunFolderWarning)  # :func:`start` reports a torn line
            records = checkpoints.all()
    except DamagedFileError:
        return  # :func:`start` reports it, as it always has
    for record in reversed(records):
        # The cursor (len, 0) is a dataset handed out to its end; an owed item needs its batch.
        needed = [(record.cursor[0] + (record.cursor[1] > 0), record.cursor)]
        needed += [(batch + 1, (batch, group)) for batch, group in record.outstanding]
        batches, where = max(needed)
        if batches > dataset_length:
            raise DatasetTooShortError(record.name, record.step, str(checkpoints.path), where, dataset_length)


@dataclass(frozen=True)
class Start:
    """Where a run starts: its training client, step, and the data still owed."""

    training_client: TrainingClient
    step: int
    cursor: ItemKey
    owed: list[ItemKey]
    resumed_from: CheckpointRecord | None


async def start(config: Config, backend: Backend, checkpoints: CheckpointLog) -> Start:
    """Create the training client: from the newest checkpoint that loads when resuming, else fresh.

    A resumed run's records of the steps it will train again are removed from
    ``metrics.jsonl``, so every step has exactly one training record; a run
    resumed before its first checkpoint starts again from step 0 with an empty log.

    Raises:
        ResumeError: checkpoints are recorded but none of them loads.
    """
    log_path = Path(config.log_path)
    if config.resume:
        records = checkpoints.all(repair=True)
        for record in reversed(records):
            try:
                client = await backend.create_training_client_from_state(record.state_path, with_optimizer=True)
            except Exception as exc:
                warnings.warn(
                    f"{checkpoints.path}: checkpoint {record.name} (step {record.step}) does not load "
                    f"({type(exc).__name__}: {exc}); trying the one before it",
                    RunFolderWarning,
                    stacklevel=2,
                )
                continue
            _keep_records_before(log_path / METRICS_FILE, record.step)
            owed = [ItemKey(*key) for key in record.outstanding]
            return Start(client, record.step, ItemKey(*record.cursor), owed, record)
        if records:
            raise ResumeError(
                f"none of the {len(records)} checkpoints in {checkpoints.path} loads (see the warnings); "
                "restore their files, or start again with overwrite=True (--overwrite)"
            )
        _keep_records_before(log_path / METRICS_FILE, 0)
    if config.load_checkpoint_path is not None:
        client = await backend.create_training_client_from_state(config.load_checkpoint_path, with_optimizer=False)
    else:
        client = await backend.create_training_client(
            base_model=config.base_model, lora_rank=config.lora_rank, seed=config.seed
        )
    return Start(client, 0, ItemKey(0, 0), [], None)


def _keep_records_before(path: Path, step: int) -> None:
    """Forget records of steps a resumed run will train again (and the old end-of-run record)."""
    if path.exists():
        rewrite_records(path, [r for r in read_records(path) if r.get("step", -1) < step])
