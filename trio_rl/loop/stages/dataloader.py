"""The dataloader: hands out the run's items in order, each once its schedule admits it."""

from __future__ import annotations

import trio

from ...observe.spans import activity, on_track, span
from ..channels import closed_unless_crashed
from ..items import DatasetItems
from ..work import Handout, ItemKey
from .run import Run
from .workers import WorkerPool


async def dataloader_with_workers(stop: trio.CancelScope, items: DatasetItems, run: Run, workers: WorkerPool) -> None:
    """The dataloader and the workers it starts, in a nursery the trainer cancels through ``stop``."""
    with stop:
        async with trio.open_nursery() as nursery:
            workers.start_in(nursery)
            await dataloader(items, run, workers)


async def dataloader(items: DatasetItems, run: Run, workers: WorkerPool) -> None:
    """Hand out the run's items in order, each once its schedule admits it; resampled items first.

    Closes the items channel when the data runs out, which is how the end of
    data reaches the workers and then the trainer. Where the run resamples,
    items resampled while fresh data remained are handed out again; the back
    edge is then closed, so that later ones are dropped and counted
    (:class:`~trio_rl.loop.resampling.Resampling`).
    """
    notes, gate, resampling = run.ledger.notes, run.gate, run.resampling
    with (
        workers.closed_unless_crashed(),
        closed_unless_crashed(notes),
        resampling.dataloader_side(),
        on_track("dataloader"),
        activity("dataloader"),
    ):
        for entry in items:
            if isinstance(entry, ItemKey):
                notes.send_nowait(Handout(None, entry))
                continue
            admission = run.schedule.admit(entry.position, run.start_step)
            while True:
                if resampled := resampling.take_ready():
                    for item in resampled:
                        await workers.hand_out(item)
                    continue
                if gate.consumed >= admission.consumed_before:
                    break
                # No checkpoint since the checks: a resample or consumption from
                # here on wakes this wait.
                with span("wait_for_admission"):
                    await gate.wait_for_change()
            notes.send_nowait(Handout(entry.key, entry.next_cursor))
            with span("hand_out"):
                await workers.hand_out(entry.item(admission))
        for item in resampling.take_last():
            await workers.hand_out(item)
