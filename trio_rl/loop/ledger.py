"""The data ledger: which dataset items a run has handed out and not yet trained or dropped.

The trainer task owns it. The dataloader never writes to it: it sends a
:class:`~trio_rl.loop.work.Handout` note on :attr:`DataLedger.notes` for every
item it hands out, and the ledger reads those notes (without waiting) before it
is consulted. The dataloader sends a note before the item itself, so an item
that reaches the trainer is always already in the ledger once the notes are read.

A checkpoint records the ledger's cursor and outstanding items, so that a
resumed run neither loses nor replays an item.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from .work import Handout, ItemKey


@dataclass(frozen=True)
class DataLedgerStatistics:
    """What :meth:`DataLedger.statistics` returns.

    Attributes:
        cursor: the first dataset position not yet handed out.
        outstanding: items handed out (or owed) and neither trained nor dropped.
        notes_unread: hand-out notes sent by the dataloader and not yet read.
        empty_batches: empty dataset batches skipped.
        dataloader_done: whether the dataloader is done.
    """

    cursor: ItemKey
    outstanding: int
    notes_unread: int
    empty_batches: int
    dataloader_done: bool


class DataLedger:
    """Cursor and outstanding items of one run, fed by the dataloader's notes.

    Args:
        cursor: the first dataset position not yet handed out.
        outstanding: items handed out before a resume and still owed.
    """

    def __init__(self, cursor: ItemKey, outstanding: Iterable[ItemKey]) -> None:
        self.cursor = cursor
        # Unbounded: the dataloader notes a hand-out without ever waiting for the trainer.
        self.notes, self._notes = trio.open_memory_channel[Handout](math.inf)
        """The dataloader's end of the notes channel; it closes it when it is done."""
        self._outstanding: dict[ItemKey, None] = dict.fromkeys(outstanding)
        self.empty_batches = 0
        """Empty dataset batches the dataloader skipped."""
        self.dataloader_done = False
        """Whether the dataloader is done (every note read): nothing more is handed out."""

    def statistics(self) -> DataLedgerStatistics:
        """The ledger's state, without reading the notes waiting (so it changes nothing)."""
        return DataLedgerStatistics(
            cursor=self.cursor,
            outstanding=len(self._outstanding),
            notes_unread=self._notes.statistics().current_buffer_used,
            empty_batches=self.empty_batches,
            dataloader_done=self.dataloader_done,
        )

    def read_notes(self) -> None:
        """Take in every note sent so far (never waits)."""
        while True:
            try:
                note = self._notes.receive_nowait()
            except trio.WouldBlock:
                return
            except trio.EndOfChannel:
                self.dataloader_done = True
                return
            if note.key is None:
                self.empty_batches += 1
            else:
                # A resumed run's owed items are outstanding already; setdefault keeps their place.
                self._outstanding.setdefault(note.key, None)
            if note.next_cursor is not None:
                self.cursor = note.next_cursor

    def retire(self, keys: Iterable[ItemKey]) -> None:
        """Items trained or dropped: no longer owed."""
        # Their notes were sent before them, so read those first.
        self.read_notes()
        for key in keys:
            self._outstanding.pop(key, None)

    def outstanding_as_read(self) -> list[ItemKey]:
        """:attr:`outstanding` without reading the notes waiting: for a report from another task, which must change nothing."""
        return sorted(self._outstanding)

    @property
    def outstanding(self) -> list[ItemKey]:
        """Items handed out (or owed from before a resume) and neither trained nor dropped."""
        self.read_notes()
        return sorted(self._outstanding)
