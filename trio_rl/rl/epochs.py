"""Several passes over a dataset: tinker-cookbook 0.6.1's ``num_epochs`` (``rl/dataset_utils.py``)."""

from __future__ import annotations

from collections.abc import Sequence

from ..types import EnvGroupBuilder, RLDataset


class EpochCycledDataset(RLDataset):
    """``inner`` repeated ``num_epochs`` times: batch ``i`` is ``inner.get_batch(i % len(inner))``.

    Steps, checkpoints and resume count batches across epochs, as 0.6.1's
    ``EpochCycledRLDataset`` (without its ``shuffle_seed``, which 0.6.1's ``main``
    does not set): every epoch replays the inner batches in their own order, and
    ``num_epochs=1`` is the dataset itself.

    Args:
        inner: the dataset; it must not be empty when ``num_epochs > 1``.
        num_epochs: passes, at least 1.

    Raises:
        ValueError: for ``num_epochs < 1``.
    """

    def __init__(self, inner: RLDataset, num_epochs: int) -> None:
        if num_epochs < 1:
            raise ValueError(f"num_epochs must be >= 1, got {num_epochs}")
        self.inner = inner
        self.num_epochs = num_epochs

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} is out of range (the dataset has {len(self)} batches over its epochs)")
        return self.inner.get_batch(index % len(self.inner))

    def __len__(self) -> int:
        return len(self.inner) * self.num_epochs


def with_epochs(dataset: RLDataset, num_epochs: int) -> RLDataset:
    """``dataset`` for ``num_epochs`` passes (itself when that is 1)."""
    return dataset if num_epochs == 1 else EpochCycledDataset(dataset, num_epochs)
