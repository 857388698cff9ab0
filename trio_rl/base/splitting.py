"""Splitting a sequence into near-equal contiguous parts: a step into minibatches or substeps."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def split_evenly(items: Sequence[T], parts: int) -> list[list[T]]:
    """Split ``items`` into ``parts`` contiguous chunks whose sizes differ by at most one.

    Args:
        items: what to split, in order.
        parts: how many chunks (some are empty when ``items`` has fewer elements).

    Returns:
        The chunks, the longer ones first.
    """
    size, extra = divmod(len(items), parts)
    chunks: list[list[T]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        chunks.append(list(items[start:end]))
        start = end
    return chunks
