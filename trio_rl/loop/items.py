"""The items a run hands out, in order, each with its position for the schedule to admit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ..types import EnvGroupBuilder, RLDataset
from .schedules import Admission, Position
from .work import ItemKey, WorkItem


@dataclass(frozen=True)
class Fresh:
    """A dataset item not yet handed out in this run, and the cursor past it (None for an owed item)."""

    key: ItemKey
    builder: EnvGroupBuilder
    position: Position
    next_cursor: ItemKey | None

    def item(self, admission: Admission) -> WorkItem:
        """The work item for this entry, as its schedule admitted it."""
        return WorkItem(
            self.key,
            self.position.order,
            self.builder,
            attempt=0,
            min_version=admission.min_version,
            step=admission.step,
            step_size=admission.step_size,
        )


class DatasetItems:
    """The items a run hands out, in order: a resumed run's owed items, then the dataset from the cursor.

    Each dataset batch is built once (the first one was already built to check the configuration).
    """

    def __init__(
        self, dataset: RLDataset, first_batch: Sequence[EnvGroupBuilder], cursor: ItemKey, owed: Sequence[ItemKey]
    ) -> None:
        self._dataset = dataset
        self._cursor = cursor
        self._owed: dict[int, list[int]] = {}
        for key in sorted(owed):
            self._owed.setdefault(key.batch, []).append(key.group)
        self._cached: tuple[int, Sequence[EnvGroupBuilder]] = (0, first_batch)

    def _batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if self._cached[0] != index:
            self._cached = (index, self._dataset.get_batch(index))
        return self._cached[1]

    def __iter__(self) -> Iterator[Fresh | ItemKey]:
        """Fresh items, and for each empty dataset batch the cursor past it."""
        cursor = self._cursor
        order = batch_number = batch_start = previous_start = 0
        batches = sorted(set(self._owed) | set(range(cursor.batch, len(self._dataset))))
        for b in batches:
            builders = self._batch(b)
            owed = self._owed.get(b, [])
            fresh = range(cursor.group if b == cursor.batch else 0, len(builders)) if b >= cursor.batch else range(0)
            groups = [(g, None) for g in owed] + [(g, _after(b, g, len(builders))) for g in fresh]
            if not groups:
                if b >= cursor.batch:
                    yield ItemKey(b + 1, 0)
                continue
            previous_start, batch_start = batch_start, order
            for g, next_cursor in groups:
                position = Position(order, batch_number, batch_start, previous_start, len(groups))
                yield Fresh(ItemKey(b, g), builders[g], position, next_cursor)
                order += 1
            batch_number += 1


def _after(batch: int, group: int, batch_size: int) -> ItemKey:
    return ItemKey(batch, group + 1) if group + 1 < batch_size else ItemKey(batch + 1, 0)
