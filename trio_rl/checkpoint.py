"""The checkpoint log: which state was saved at which step, and what data was outstanding."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

CHECKPOINTS_FILE = "checkpoints.jsonl"


@dataclass(frozen=True)
class Checkpoint:
    """One saved training state.

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
    """Appends :class:`Checkpoint` records to ``checkpoints.jsonl`` in a run's folder."""

    def __init__(self, log_path: Path) -> None:
        self.path = log_path / CHECKPOINTS_FILE

    def append(self, checkpoint: Checkpoint) -> None:
        """Record ``checkpoint``."""
        with self.path.open("a") as f:
            f.write(json.dumps(asdict(checkpoint)) + "\n")

    def all(self) -> list[Checkpoint]:
        """Every checkpoint recorded, oldest first."""
        if not self.path.exists():
            return []
        return [_parse(line) for line in self.path.read_text().splitlines() if line.strip()]

    def last(self) -> Checkpoint | None:
        """The newest checkpoint recorded, or None."""
        checkpoints = self.all()
        return checkpoints[-1] if checkpoints else None


def _parse(line: str) -> Checkpoint:
    raw = json.loads(line)
    raw["cursor"] = tuple(raw["cursor"])
    raw["outstanding"] = [tuple(item) for item in raw["outstanding"]]
    return Checkpoint(**raw)
