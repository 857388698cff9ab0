"""Checkpoints: which state was saved at which step, and what data was still owed then."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import trio

from .backends.protocol import TrainingClient
from .jsonl import DamagedFileError, read_records
from .ledger import DataLedger

CHECKPOINTS_FILE = "checkpoints.jsonl"


@dataclass(frozen=True)
class CheckpointRecord:
    """One saved training state, as a line of ``checkpoints.jsonl``.

    Attributes:
        name: the name the state was saved under.
        step: training steps completed when it was saved (the weights version).
        state_path: where ``save_state`` put weights and optimizer state.
        cursor: the next ``(batch, group)`` of the dataset not yet handed out.
        outstanding: ``(batch, group)`` items handed out but neither trained nor
            dropped when the state was saved; a resumed run samples them first.
        final: whether the run ended here.
        reason: why it was saved (``"periodic"``, ``"final"``, ``"cancelled"``).
    """

    name: str
    step: int
    state_path: str
    cursor: tuple[int, int]
    outstanding: list[tuple[int, int]] = field(default_factory=list[tuple[int, int]])
    final: bool = False
    reason: str = "periodic"


class CheckpointLog:
    """Appends :class:`CheckpointRecord` lines to ``checkpoints.jsonl`` in a run's folder."""

    def __init__(self, log_path: Path) -> None:
        self.path = log_path / CHECKPOINTS_FILE

    def append(self, checkpoint: CheckpointRecord) -> None:
        """Record ``checkpoint``."""
        with self.path.open("a") as f:
            f.write(json.dumps(asdict(checkpoint)) + "\n")

    def all(self, *, repair: bool = False) -> list[CheckpointRecord]:
        """Every checkpoint recorded, oldest first; a torn last line is ignored (and cut, with ``repair``).

        Raises:
            DamagedFileError: a record is malformed; the message names the file and line.
        """
        return [_parse(raw, self.path, n) for n, raw in enumerate(read_records(self.path, repair=repair), start=1)]

    def last(self) -> CheckpointRecord | None:
        """The newest checkpoint recorded, or None."""
        checkpoints = self.all()
        return checkpoints[-1] if checkpoints else None


def _parse(raw: dict[str, object], path: Path, number: int) -> CheckpointRecord:
    try:
        fields = dict(raw)
        fields["cursor"] = tuple(fields["cursor"])  # type: ignore[arg-type]
        fields["outstanding"] = [tuple(item) for item in fields.get("outstanding", [])]  # type: ignore[attr-defined]
        return CheckpointRecord(**fields)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise DamagedFileError(f"{path}, record {number}: not a trio_rl checkpoint record ({exc!r})") from None


class CheckpointKeeper:
    """Saves the training state with the ledger's view of the data; owned by the trainer task.

    Args:
        log: the run's checkpoint log.
        client: the training client whose state is saved.
        ledger: the run's data ledger, read at each save.
        shielded: finish a save that a cancellation interrupts (``Config.save_on_cancel``):
            an interrupted save may still be writing, so it must not be started again.
    """

    def __init__(self, log: CheckpointLog, client: TrainingClient, ledger: DataLedger, *, shielded: bool) -> None:
        self._log = log
        self._client = client
        self._ledger = ledger
        self._shielded = shielded
        self._last: tuple[int, str] | None = None
        self.final: CheckpointRecord | None = None
        """The final checkpoint, once written."""

    async def save(self, step: int, *, final: bool, reason: str) -> CheckpointRecord:
        """Save the state after ``step`` steps and record it."""
        name = f"step_{step:06d}"
        # The weights of a step saved periodically are still the final ones:
        # record that state again as final rather than save it twice.
        if self._last is None or self._last[0] != step:
            with trio.CancelScope(shield=self._shielded):
                self._last = (step, await self._client.save_state(name))
        assert self._last is not None and self._last[0] == step
        path = self._last[1]
        ledger = self._ledger
        ledger.read_notes()
        record = CheckpointRecord(
            name=name,
            step=step,
            state_path=path,
            cursor=(ledger.cursor.batch, ledger.cursor.group),
            outstanding=[(k.batch, k.group) for k in ledger.outstanding],
            final=final,
            reason=reason,
        )
        self._log.append(record)
        if final:
            self.final = record
        return record
