"""DatasetItems on its own: what a run hands out, in order, with each item's position, fresh or resumed."""

from __future__ import annotations

from trio_rl.loop.items import DatasetItems, Fresh
from trio_rl.loop.schedules import Position
from trio_rl.loop.work import ItemKey
from trio_rl.testing import FakeDataset


def _items(dataset: FakeDataset, cursor: ItemKey, owed: list[ItemKey]) -> list[Fresh | ItemKey]:
    return list(DatasetItems(dataset, dataset.get_batch(0), cursor, owed))


def _fresh(items: list[Fresh | ItemKey]) -> list[Fresh]:
    return [i for i in items if isinstance(i, Fresh)]


def test_a_fresh_run_hands_out_every_item_in_order_with_its_position_and_cursor() -> None:
    dataset = FakeDataset(batch_sizes=[2, 3])
    items = _items(dataset, ItemKey(0, 0), [])
    fresh = _fresh(items)
    assert len(fresh) == len(items)
    assert [i.key for i in fresh] == [ItemKey(0, 0), ItemKey(0, 1), ItemKey(1, 0), ItemKey(1, 1), ItemKey(1, 2)]
    assert [i.position for i in fresh] == [
        Position(0, 0, 0, 0, 2),
        Position(1, 0, 0, 0, 2),
        Position(2, 1, 2, 0, 3),
        Position(3, 1, 2, 0, 3),
        Position(4, 1, 2, 0, 3),
    ]
    assert [i.next_cursor for i in fresh] == [ItemKey(0, 1), ItemKey(1, 0), ItemKey(1, 1), ItemKey(1, 2), ItemKey(2, 0)]
    # Each batch built once: the first was built already, to check the configuration.
    assert dataset.batches_built == [0, 1]
    assert fresh[3].builder is dataset.get_batch(1)[1]


def test_a_resumed_run_hands_out_its_owed_items_first_in_their_batch_then_the_rest_from_the_cursor() -> None:
    dataset = FakeDataset(batch_sizes=[4, 3, 2])
    items = _items(dataset, ItemKey(1, 1), [ItemKey(1, 0), ItemKey(0, 2)])
    fresh = _fresh(items)
    assert [i.key for i in fresh] == [
        ItemKey(0, 2),
        ItemKey(1, 0),
        ItemKey(1, 1),
        ItemKey(1, 2),
        ItemKey(2, 0),
        ItemKey(2, 1),
    ]
    # An owed item does not move the cursor; a fresh one moves it past itself.
    assert [i.next_cursor for i in fresh] == [None, None, ItemKey(1, 2), ItemKey(2, 0), ItemKey(2, 1), ItemKey(3, 0)]
    # Positions count this run's items only: batch 0 hands out one, batch 1 three.
    assert [i.position for i in fresh] == [
        Position(0, 0, 0, 0, 1),
        Position(1, 1, 1, 0, 3),
        Position(2, 1, 1, 0, 3),
        Position(3, 1, 1, 0, 3),
        Position(4, 2, 4, 1, 2),
        Position(5, 2, 4, 1, 2),
    ]


def test_an_empty_batch_yields_the_cursor_past_it_and_takes_no_batch_number() -> None:
    dataset = FakeDataset(batch_sizes=[1, 0, 2])
    items = _items(dataset, ItemKey(0, 0), [])
    assert items[1] == ItemKey(2, 0)
    fresh = _fresh(items)
    assert [i.key for i in fresh] == [ItemKey(0, 0), ItemKey(2, 0), ItemKey(2, 1)]
    assert [i.position.batch_number for i in fresh] == [0, 1, 1]


def test_a_run_resumed_at_the_end_of_the_data_hands_out_only_what_it_owes() -> None:
    dataset = FakeDataset(batch_sizes=[2, 2])
    items = _items(dataset, ItemKey(2, 0), [ItemKey(1, 1)])
    assert [(i.key, i.next_cursor) for i in _fresh(items)] == [(ItemKey(1, 1), None)]
    assert len(items) == 1
    # Batch 0 owes nothing and is past the cursor: it is not built again.
    assert dataset.batches_built == [0, 1]
