"""Observations with chunks other than tokens (images), position by position, as training data needs them.

A sequence being built into a Datum is a list of positions: a token id for each
token, and an :class:`ChunkPosition` for each position an image (or any chunk
that is not ``EncodedTextChunk``) takes up. So the prefix test that merges turns
and the shift of inputs and targets work on one flat list, and the Datum's
``model_input`` gets each image back whole, as tinker-cookbook 0.6.1's
``rl/data_processing.py`` keeps it (its targets read 0 at image positions).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tinker import types as tinker_types

from .. import _tinker_compat as compat


@dataclass(frozen=True)
class ChunkPosition:
    """One of the positions a non-text chunk takes up in a sequence.

    Attributes:
        digest: what the chunk holds (two equal chunks have equal digests), so
            that comparing sequences never compares image bytes position by position.
        offset: the position's index within the chunk.
        chunk: the chunk itself (not compared).
    """

    digest: bytes
    offset: int
    chunk: Any = field(compare=False)


Position = int | ChunkPosition
"""A token id, or one of the positions of a non-text chunk."""


def observation_positions(ob: tinker_types.ModelInput, turn: int) -> tuple[list[Position], bool]:
    """The observation's positions, and whether any of them is a non-text chunk's.

    Raises:
        ValueError: a non-text chunk has no length (an image without ``expected_tokens``).
    """
    chunks = ob.chunks
    if all(isinstance(chunk, tinker_types.EncodedTextChunk) for chunk in chunks):
        return list(ob.to_ints()), False
    positions: list[Position] = []
    for chunk in chunks:
        if isinstance(chunk, tinker_types.EncodedTextChunk):
            positions.extend(chunk.tokens)
            continue
        try:
            length = chunk.length
        except ValueError as exc:
            raise ValueError(
                f"turn {turn}: the observation's {type(chunk).__name__} has no length ({exc}); set its "
                "expected_tokens, which training data needs to place the tokens after it"
            ) from exc
        digest = _digest(chunk)
        positions.extend(ChunkPosition(digest, offset, chunk) for offset in range(length))
    return positions, True


def model_input_from_positions(positions: Sequence[Position]) -> tinker_types.ModelInput:
    """A ``ModelInput`` of ``positions``: runs of tokens as text chunks, each chunk's positions as the chunk.

    Raises:
        ValueError: the positions hold only part of a chunk.
    """
    chunks: list[Any] = []
    tokens: list[int] = []
    index = 0
    while index < len(positions):
        position = positions[index]
        if isinstance(position, int):
            tokens.append(position)
            index += 1
            continue
        if tokens:
            chunks.append(tinker_types.EncodedTextChunk(tokens=tokens))
            tokens = []
        length = position.chunk.length
        if position.offset != 0 or index + length > len(positions):
            raise ValueError(f"a Datum would hold part of a {type(position.chunk).__name__}; a chunk is kept whole")
        chunks.append(position.chunk)
        index += length
    if tokens:
        chunks.append(tinker_types.EncodedTextChunk(tokens=tokens))
    return tinker_types.ModelInput(chunks=chunks)


def target_ids(positions: Sequence[Position]) -> list[int]:
    """Token ids for targets: a non-text chunk's positions read 0, as in tinker-cookbook 0.6.1."""
    return [p if isinstance(p, int) else 0 for p in positions]


def with_token_appended(model_input: tinker_types.ModelInput, token: int) -> tinker_types.ModelInput:
    """``model_input`` followed by ``token``, its chunks (images included) kept."""
    chunks = model_input.chunks
    if all(isinstance(chunk, tinker_types.EncodedTextChunk) for chunk in chunks):
        return compat.model_input_from_ints([*model_input.to_ints(), token])
    return tinker_types.ModelInput(chunks=[*chunks, tinker_types.EncodedTextChunk(tokens=[token])])


def _digest(chunk: Any) -> bytes:
    fields = sorted((name, value) for name, value in vars(chunk).items())
    return hashlib.blake2b(repr((type(chunk).__name__, fields)).encode(), digest_size=16).digest()
