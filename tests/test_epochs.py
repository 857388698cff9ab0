"""trio_rl.rl.epochs: the dataset's batches replayed for num_epochs passes, as tinker-cookbook 0.6.1's."""

from __future__ import annotations

import pytest

from trio_rl.rl.epochs import EpochCycledDataset, with_epochs
from trio_rl.testing import FakeDataset, FakeEnvSpec


def test_batches_repeat_in_order_across_epochs() -> None:
    inner = FakeDataset(num_batches=3, batch_size=2, spec=FakeEnvSpec())
    cycled = EpochCycledDataset(inner, 2)
    assert len(cycled) == 6
    assert [cycled.get_batch(i) for i in range(6)] == [inner.get_batch(i % 3) for i in range(6)]
    with pytest.raises(IndexError, match="out of range"):
        cycled.get_batch(6)


def test_one_epoch_is_the_dataset_itself() -> None:
    inner = FakeDataset(num_batches=2, batch_size=1, spec=FakeEnvSpec())
    assert with_epochs(inner, 1) is inner


@pytest.mark.parametrize("bad", [0, -1])
def test_num_epochs_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="num_epochs must be >= 1"):
        EpochCycledDataset(FakeDataset(num_batches=1, batch_size=1, spec=FakeEnvSpec()), bad)
