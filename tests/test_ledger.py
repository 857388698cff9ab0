"""DataLedger on its own: the cursor and the outstanding items, read from the dataloader's notes."""

from __future__ import annotations

from trio_rl.loop.ledger import DataLedger
from trio_rl.loop.work import Handout, ItemKey


def test_handed_out_items_are_outstanding_until_retired_and_move_the_cursor() -> None:
    ledger = DataLedger(ItemKey(0, 0), [])
    ledger.notes.send_nowait(Handout(ItemKey(0, 1), ItemKey(0, 2)))
    ledger.notes.send_nowait(Handout(ItemKey(0, 0), ItemKey(0, 1)))
    assert ledger.outstanding == [ItemKey(0, 0), ItemKey(0, 1)]
    assert ledger.cursor == ItemKey(0, 1)  # the last note's
    ledger.retire([ItemKey(0, 1), ItemKey(5, 5)])  # retiring an unknown item is no error
    assert ledger.outstanding == [ItemKey(0, 0)]


def test_retire_reads_the_notes_sent_before_it() -> None:
    # The dataloader notes an item before sending it, so an item the trainer
    # retires may have a note not read yet: it must not come back as outstanding.
    ledger = DataLedger(ItemKey(0, 0), [])
    ledger.notes.send_nowait(Handout(ItemKey(0, 0), ItemKey(1, 0)))
    ledger.retire([ItemKey(0, 0)])
    assert ledger.outstanding == []
    assert ledger.cursor == ItemKey(1, 0)


def test_a_resumed_runs_owed_items_stay_owed_and_do_not_move_the_cursor() -> None:
    ledger = DataLedger(ItemKey(2, 0), [ItemKey(1, 3), ItemKey(0, 2)])
    assert ledger.outstanding == [ItemKey(0, 2), ItemKey(1, 3)]
    ledger.notes.send_nowait(Handout(ItemKey(0, 2), None))  # handed out again
    ledger.notes.send_nowait(Handout(ItemKey(2, 0), ItemKey(2, 1)))
    assert ledger.outstanding == [ItemKey(0, 2), ItemKey(1, 3), ItemKey(2, 0)]
    assert ledger.cursor == ItemKey(2, 1)
    ledger.retire([ItemKey(0, 2)])
    assert ledger.outstanding == [ItemKey(1, 3), ItemKey(2, 0)]


def test_empty_batches_are_counted_and_the_end_of_the_notes_is_seen() -> None:
    ledger = DataLedger(ItemKey(0, 0), [])
    ledger.notes.send_nowait(Handout(None, ItemKey(1, 0)))
    ledger.notes.send_nowait(Handout(None, ItemKey(2, 0)))
    ledger.read_notes()
    assert (ledger.empty_batches, ledger.cursor, ledger.dataloader_done) == (2, ItemKey(2, 0), False)
    ledger.notes.close()
    ledger.read_notes()
    assert ledger.dataloader_done
    assert ledger.outstanding == []
