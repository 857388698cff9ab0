"""A ``sample`` call as the batching engine sees it: the checked request and its sampled rows."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import trio
from tinker import types as tinker_types


def row_seed(seed: int, index: int) -> int:
    """A 63-bit seed for sample ``index`` of a request seeded with ``seed`` (SplitMix64 mix)."""
    mask = (1 << 64) - 1
    z = (seed * 0x9E3779B97F4A7C15 + (index + 1) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


@dataclass(eq=False)
class Request:
    """One ``sample`` call: its prompt, parameters, and the samples delivered so far."""

    prompt: list[int]
    num_samples: int
    max_new: int
    temperature: float
    top_k: int
    top_p: float
    stop_ids: frozenset[int]
    stop_seqs: list[tuple[int, ...]]
    stop_strings: list[str]
    seed: int
    done: trio.Event = field(default_factory=trio.Event)
    results: list[tinker_types.SampledSequence | None] = field(default_factory=list)
    remaining: int = 0
    error: BaseException | None = None
    cancelled: bool = False
    cached_tokens: int = 0
    """Prompt tokens served from the engine's prefix cache (``prompt_cache_hit_tokens``)."""


@dataclass(eq=False)
class Row:
    """One sample of a request being decoded, with its own random generator."""

    request: Request
    index: int
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The weights version that produced each token (reported by in-flight engines only)."""

    def stopped(self, stop_string_hit: Callable[[Row], bool]) -> bool:
        """Whether the last token ends this row at one of its request's stops."""
        request = self.request
        return (
            self.tokens[-1] in request.stop_ids
            or any(tuple(self.tokens[-len(s) :]) == s for s in request.stop_seqs)
            or (bool(request.stop_strings) and stop_string_hit(self))
        )


@dataclass(frozen=True)
class Limits:
    """What a request must fit: the vocabulary, the sequence length, the default stops."""

    vocab_size: int
    max_seq_len: int
    default_stop_ids: frozenset[int]


def _stops(
    stop: str | Sequence[str] | Sequence[int] | None,
    default_ids: frozenset[int],
    encode: Callable[[str], list[tuple[int, ...]] | None],
) -> tuple[set[int], list[tuple[int, ...]], list[str]]:
    """A ``SamplingParams.stop`` as single stop tokens, stop token sequences and text stop strings."""
    ids: set[int] = set()
    seqs: list[tuple[int, ...]] = []
    strings: list[str] = []
    if stop is None:
        return set(default_ids), seqs, strings
    items: list[str | int] = [stop] if isinstance(stop, str) else list(stop)
    for item in items:
        if isinstance(item, str):
            encoded = encode(item)
            if encoded is None:
                strings += [item] if item else []
                continue
        else:
            encoded = [(int(item),)]
        for seq in encoded:
            if len(seq) == 1:
                ids.add(seq[0])
            elif seq:
                seqs.append(seq)
    return ids, seqs, strings


def build_request(
    prompt: list[int],
    num_samples: int,
    params: tinker_types.SamplingParams,
    limits: Limits,
    encode_stop: Callable[[str], list[tuple[int, ...]] | None],
    rng: random.Random,
) -> Request:
    """Check a ``sample`` call and turn it into a :class:`Request`.

    Args:
        encode_stop: a stop string as token sequences, or ``None`` to match it as text.
        rng: draws the seed of a request that brings none.

    Raises:
        ValueError: for an empty or too-long prompt, bad token ids or bad params.
    """
    if num_samples < 1:
        raise ValueError("num_samples must be at least 1")
    if not prompt:
        raise ValueError("the prompt must hold at least one token")
    if len(prompt) >= limits.max_seq_len:
        raise ValueError(f"prompt of {len(prompt)} tokens leaves no room (max_seq_len {limits.max_seq_len})")
    if any(not 0 <= t < limits.vocab_size for t in prompt):
        raise ValueError(f"prompt has token ids outside [0, {limits.vocab_size})")
    if params.max_tokens is not None and params.max_tokens < 0:
        raise ValueError("max_tokens must not be negative")
    if not 0.0 < params.top_p <= 1.0:
        raise ValueError("top_p must be in (0, 1]")
    room = limits.max_seq_len - len(prompt)
    stop_ids, stop_seqs, stop_strings = _stops(params.stop, limits.default_stop_ids, encode_stop)
    return Request(
        prompt=prompt,
        num_samples=num_samples,
        max_new=room if params.max_tokens is None else min(params.max_tokens, room),
        temperature=float(params.temperature),
        top_k=int(params.top_k),
        top_p=float(params.top_p),
        stop_ids=frozenset(stop_ids),
        stop_seqs=stop_seqs,
        stop_strings=stop_strings,
        seed=int(params.seed if params.seed is not None else rng.getrandbits(63)),
        results=[None] * num_samples,
        remaining=num_samples,
    )
