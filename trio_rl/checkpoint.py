"""Checkpoints: which state was saved at which step, and what data was still owed then."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .backends.protocol import TrainingClient
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
    outstanding: list[tuple[int, int]] = field(default_factory=list)
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

    def all(self) -> list[CheckpointRecord]:
        """Every checkpoint recorded, oldest first."""
        if not self.path.exists():
            return []
        return [_parse(line) for line in self.path.read_text().splitlines() if line.strip()]

    def last(self) -> CheckpointRecord | None:
        """The newest checkpoint recorded, or None."""
        checkpoints = self.all()
        return checkpoints[-1] if checkpoints else None


def _parse(line: str) -> CheckpointRecord:
    raw = json.loads(line)
    raw["cursor"] = tuple(raw["cursor"])
    raw["outstanding"] = [tuple(item) for item in raw["outstanding"]]
    return CheckpointRecord(**raw)


class CheckpointKeeper:
    """Saves the training state with the ledger's view of the data; owned by the trainer task.

    Args:
        log: the run's checkpoint log.
        client: the training client whose state is saved.
        ledger: the run's data ledger, read at each save.
    """

    def __init__(self, log: CheckpointLog, client: TrainingClient, ledger: DataLedger) -> None:
        self._log = log
        self._client = client
        self._ledger = ledger
        self._last: tuple[int, str] | None = None
        self.final: CheckpointRecord | None = None
        """The final checkpoint, once written."""

    async def save(self, step: int, *, final: bool, reason: str) -> CheckpointRecord:
        """Save the state after ``step`` steps and record it."""
        name = f"step_{step:06d}"
        # The weights of a step saved periodically are still the final ones:
        # record that state again as final rather than save it twice.
        if self._last is not None and self._last[0] == step:
            path = self._last[1]
        else:
            path = await self._client.save_state(name)
            self._last = (step, path)
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
