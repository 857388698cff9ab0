"""The dataloader: hands out the run's items in order, each once its schedule admits it."""

from __future__ import annotations

from contextlib import nullcontext

import trio

from ..channels import closed_unless_crashed, ready
from ..items import DatasetItems
from ..work import Handout, ItemKey, WorkItem
from .run import Run
from .workers import WorkerPool


async def dataloader_with_workers(
    stop: trio.CancelScope,
    items: DatasetItems,
    run: Run,
    workers: WorkerPool,
    resampled: trio.MemoryReceiveChannel[WorkItem] | None,
) -> None:
    """The dataloader and the workers it starts, in a nursery the trainer cancels through ``stop``."""
    with stop:
        async with trio.open_nursery() as nursery:
            workers.start_in(nursery)
            await dataloader(items, run, workers, resampled)


async def dataloader(
    items: DatasetItems,
    run: Run,
    workers: WorkerPool,
    resampled: trio.MemoryReceiveChannel[WorkItem] | None,
) -> None:
    """Hand out the run's items in order, each once its schedule admits it; resampled items first.

    Closes the items channel when the data runs out, which is how the end of
    data reaches the workers and then the trainer. Items sent back while fresh
    data remained are handed out again; the back channel is then closed, so
    that later resamples fail fast and are counted as drops by the trainer.
    """
    notes, gate = run.ledger.notes, run.gate
    with (
        workers.closed_unless_crashed(),
        closed_unless_crashed(notes),
        resampled if resampled is not None else nullcontext(),
    ):
        for entry in items:
            if isinstance(entry, ItemKey):
                notes.send_nowait(Handout(None, entry))
                continue
            admission = run.schedule.admit(entry.position, run.start_step)
            while True:
                if again := ready(resampled):
                    for item in again:
                        await workers.hand_out(item)
                    continue
                if gate.consumed >= admission.consumed_before:
                    break
                # No checkpoint since the checks: a resample or consumption from
                # here on wakes this wait.
                await gate.wait_for_change()
            notes.send_nowait(Handout(entry.key, entry.next_cursor))
            await workers.hand_out(entry.item(admission))
        # Take what was resampled while data remained and close the back channel
        # in the same step (no checkpoint between), so nothing sent back is
        # ever left unread in its buffer.
        last = ready(resampled)
        if resampled is not None:
            resampled.close()
        for item in last:
            await workers.hand_out(item)
