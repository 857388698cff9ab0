"""Counting what an in-process sampler's engine prefills, for the prefix-cache tests of both local backends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio
from tinker import types as tinker_types


def count_prefilled_tokens(sampler: Any) -> list[list[int]]:
    """Record, for each prefill pass of ``sampler``'s engine, how many tokens of each prompt it computed."""
    engine = sampler._engine
    original = engine._prefill_prompts
    passes: list[list[int]] = []

    def counted(prompts: list[list[int]], pasts: Any = None) -> Any:
        held = [kv[0][0].shape[2] if kv else 0 for kv in (pasts or [[]] * len(prompts))]
        passes.append([len(p) - n for p, n in zip(prompts, held, strict=True)])
        return original(prompts, pasts) if pasts is not None else original(prompts)

    engine._prefill_prompts = counted
    return passes


async def sample_each(
    sample: Callable[[list[int], int], Awaitable[tinker_types.SampleResponse]], prompts: Sequence[list[int]], seed: int
) -> list[tinker_types.SampleResponse]:
    """``sample(prompts[i], seed + i)`` for every prompt at once (one wave of requests); the responses in order."""
    got: dict[int, tinker_types.SampleResponse] = {}

    async def one(i: int) -> None:
        got[i] = await sample(prompts[i], seed + i)

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    return [got[i] for i in range(len(prompts))]
