"""Checkpoints: which state was saved at which step, and what data was still owed then."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from ..backends.protocol import TrainingClient
from ..base.determinism import TRAINER_FIRST, settle
from ..base.jsonl import DamagedFileError, open_for_append, read_records
from .ledger import DataLedger
from .weights import LatestWeights

CHECKPOINTS_FILE = "checkpoints.jsonl"


@dataclass(frozen=True)
class CheckpointRecord:
    """One saved training state, as a line of ``checkpoints.jsonl``.

    The first six fields are tinker-cookbook's, with its meanings, so that its
    ``checkpoint_utils.get_last_checkpoint`` and sampling tools read a trio_rl
    run; the rest are trio_rl's own.

    Attributes:
        name: ``%06d`` of the step, or ``"final"`` for the run's last state, as the cookbook
            labels its rows (the state itself is saved under ``%06d``, the name its
            sampler weights share, so a backend can tell they belong together).
        batch: training steps completed (the cookbook's batch to resume from).
        state_path: where ``save_state`` put weights and optimizer state.
        sampler_path: where the sampler weights of this step were saved, if they were saved by name.
        cumulative_tokens: tokens counted so far, by kind (sampled, prefill_cached,
            prefill_uncached, trained), discarded ones included.
        discarded_tokens: the part of those spent on groups removed by the constant-reward filter.
        step: the same as ``batch`` (the weights version).
        cursor: the next ``(batch, group)`` of the dataset not yet handed out.
        outstanding: ``(batch, group)`` items handed out but neither trained nor
            dropped when the state was saved; a resumed run samples them first.
        final: whether the run ended here.
        reason: why it was saved (``"periodic"``, ``"rolling"``, ``"final"``, ``"cancelled"``).
        counts: the run's group counts when it was saved (trained, skipped,
            dropped, resampled, filtered, ...), which a resumed run continues from,
            as it continues ``cumulative_tokens``.
        owed_evaluations: ``(step, sampler_path)`` of evaluations that were due
            and not yet recorded when the state was saved; a resumed run runs them.
    """

    name: str
    batch: int
    state_path: str
    sampler_path: str | None = None
    cumulative_tokens: dict[str, int] = field(default_factory=dict[str, int])
    discarded_tokens: dict[str, int] = field(default_factory=dict[str, int])
    step: int = -1
    cursor: tuple[int, int] = (0, 0)
    outstanding: list[tuple[int, int]] = field(default_factory=list[tuple[int, int]])
    final: bool = False
    reason: str = "periodic"
    counts: dict[str, Any] = field(default_factory=dict[str, Any])
    owed_evaluations: list[tuple[int, str | None]] = field(default_factory=list[tuple[int, str | None]])

    def __post_init__(self) -> None:
        if self.step < 0:
            object.__setattr__(self, "step", self.batch)


class CheckpointLog:
    """Appends :class:`CheckpointRecord` lines to ``checkpoints.jsonl`` in a run's folder."""

    def __init__(self, log_path: Path) -> None:
        self.path = log_path / CHECKPOINTS_FILE

    def append(self, checkpoint: CheckpointRecord) -> None:
        """Record ``checkpoint``."""
        with open_for_append(self.path) as f:
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


_RECORD_FIELDS = frozenset(f.name for f in dataclasses.fields(CheckpointRecord))


def _parse(raw: dict[str, object], path: Path, number: int) -> CheckpointRecord:
    """A trio_rl row, or a cookbook row (no ``cursor``: step ``batch`` resumes at dataset batch ``batch``)."""
    try:
        fields = {k: v for k, v in raw.items() if k in _RECORD_FIELDS}
        batch = fields.get("batch", fields.get("step"))
        if batch is None:
            raise KeyError("batch")
        fields["batch"] = batch
        fields["cursor"] = tuple(fields.get("cursor", (batch, 0)))  # type: ignore[arg-type]
        fields["outstanding"] = [tuple(item) for item in fields.get("outstanding", [])]  # type: ignore[attr-defined]
        fields["final"] = bool(fields.get("final", False))
        fields["owed_evaluations"] = [(int(s), p) for s, p in fields.get("owed_evaluations", [])]  # type: ignore[attr-defined]
        return CheckpointRecord(**fields)  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise DamagedFileError(
            f"{path}, record {number}: neither a trio_rl nor a tinker-cookbook checkpoint record ({exc!r})"
        ) from None


class CheckpointKeeper:
    """Saves the training state with the ledger's view of the data; owned by the trainer task.

    Args:
        log: the run's checkpoint log.
        client: the training client whose state is saved.
        ledger: the run's data ledger, read at each save.
        weights: the published weights, whose sampler path each row records.
        save_on_cancel: when the run is cancelled, save the last completed step
            (``Config.save_on_cancel``; the trainer asks :attr:`save_on_cancel`);
            and finish a save that a cancellation interrupts: an interrupted
            save may still be writing, so it must not be started again.
        cancel_save_timeout: how long a save may go on once a cancellation has
            come (``Config.cancel_save_timeout``); a save given up then is
            neither recorded nor started again.
    """

    def __init__(
        self,
        log: CheckpointLog,
        client: TrainingClient,
        ledger: DataLedger,
        weights: LatestWeights,
        *,
        save_on_cancel: bool,
        cancel_save_timeout: float = math.inf,
    ) -> None:
        self._log = log
        self._client = client
        self._ledger = ledger
        self._weights = weights
        self.save_on_cancel = save_on_cancel
        """Whether a cancelled run saves its last completed step (``Config.save_on_cancel``)."""
        self.cancel_save_timeout = cancel_save_timeout
        """Seconds a save may take once the run is cancelled (``Config.cancel_save_timeout``)."""
        self._last: tuple[int, str] | None = None
        self._given_up: int | None = None
        self.final: CheckpointRecord | None = None
        """The final checkpoint, once written."""

    async def save(
        self,
        step: int,
        *,
        final: bool,
        reason: str,
        tokens: tuple[dict[str, int], dict[str, int]] = ({}, {}),
        counts: dict[str, Any] | None = None,
        owed_evaluations: Callable[[], list[tuple[int, str | None]]] = list,
    ) -> CheckpointRecord | None:
        """Save the state after ``step`` steps and record it, with the cumulative and discarded ``tokens``.

        ``counts`` are the run's group counts, which must agree with the ledger
        (the trainer, which alone retires items, is the caller); ``owed_evaluations``
        is asked once the state is saved, for the evaluations still due then.

        A ``"cancelled"`` save is called from the trainer's shielded scope whose
        deadline is ``cancel_save_timeout``; it runs under that deadline, unshielded.

        Returns:
            The record written, or None when the save of this step was given up
            (see ``cancel_save_timeout``): the state and the log then still agree
            on the checkpoint before it.
        """
        name = "final" if final else f"{step:06d}"
        path = await self._state_path(step, reason)
        if path is None:
            return None
        ledger = self._ledger
        # Hand-outs due at this instant are in the row or not whatever Trio's task order.
        await settle(TRAINER_FIRST)
        ledger.read_notes()
        version, sampler = self._weights.latest()
        record = CheckpointRecord(
            name=name,
            batch=step,
            state_path=path,
            sampler_path=sampler.model_path if version == step else None,
            cumulative_tokens=tokens[0],
            discarded_tokens=tokens[1],
            step=step,
            cursor=(ledger.cursor.batch, ledger.cursor.group),
            outstanding=[(k.batch, k.group) for k in ledger.outstanding],
            final=final,
            reason=reason,
            counts=dict(counts or {}),
            owed_evaluations=owed_evaluations(),
        )
        self._log.append(record)
        if final:
            self.final = record
        return record

    async def _state_path(self, step: int, reason: str) -> str | None:
        """The path of the state after ``step``, saved now unless it already is; None when that save was given up."""
        # The weights of a step saved periodically are still the final ones:
        # record that state again as final rather than save it twice.
        if self._last is None or self._last[0] != step:
            if self._given_up == step:
                return None
            # The cancel-save runs in the caller's own shielded scope, whose
            # deadline (cancel_save_timeout) must bound it: no shield of ours there.
            await self._save_state(step, shielded=self.save_on_cancel and reason != "cancelled")
            if self._last is None or self._last[0] != step:
                return None
        return self._last[1]

    async def _save_state(self, step: int, *, shielded: bool) -> None:
        """``save_state`` under the step's name, noted in ``_last`` the moment it returns."""
        if not shielded:
            self._last = (step, await self._client.save_state(f"{step:06d}"))
            return
        # Shielded, so that a cancellation does not cut a save that may go on
        # writing; yet bounded, by cancel_save_timeout from the moment a
        # cancellation reaches the caller.
        async with trio.open_nursery() as nursery:
            with trio.CancelScope(shield=True) as shield:
                nursery.start_soon(self._bound_once_cancelled, shield)
                self._last = (step, await self._client.save_state(f"{step:06d}"))
            nursery.cancel_scope.cancel()
        if shield.cancelled_caught:
            self._given_up = step
            # Only the caller's cancellation sets that deadline: let it end the caller here.
            await trio.lowlevel.checkpoint()

    async def _bound_once_cancelled(self, shield: trio.CancelScope) -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            # By the caller's cancellation, or by us once the save is done. Not
            # raised on: a Cancelled leaving this nursery would come out in a
            # group, which the trainer's `except trio.Cancelled` does not catch.
            shield.deadline = min(shield.deadline, trio.current_time() + self.cancel_save_timeout)
