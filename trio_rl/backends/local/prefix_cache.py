"""Prefilled prompts kept for reuse: a group's prompt, sent once per env, is prefilled once.

A :class:`PrefixCache` maps a prompt's tokens to its :class:`Prefill` (the
keys and values of every layer, and the logits of its last position), least
recently used first out once the entries' bytes pass the bound. An engine
samples from one set of weights, so its cache never holds another's
prefills; an engine whose weights change must :meth:`PrefixCache.clear` it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from torch import Tensor

DEFAULT_MAX_BYTES = 64 << 20
"""Default bound of one engine's cache: about 700 prompt tokens of SmolLM2-135M in float32."""


@dataclass(frozen=True)
class Prefill:
    """One prompt's prefill: per layer keys and values ``[1, heads, length, head_dim]``, and next-token logits."""

    kv: list[tuple[Tensor, Tensor]]
    logits: Tensor

    @classmethod
    def copied(cls, kv: list[tuple[Tensor, Tensor]], logits: Tensor) -> Prefill:
        """A prefill owning copies of ``kv`` and ``logits``: views into a batch's tensors would keep the batch alive."""
        return cls([(k.clone(), v.clone()) for k, v in kv], logits.clone())

    @property
    def length(self) -> int:
        """The prompt's tokens."""
        return int(self.kv[0][0].shape[2])

    @property
    def nbytes(self) -> int:
        """Memory held by its tensors."""
        return self.logits.nbytes + sum(k.nbytes + v.nbytes for k, v in self.kv)


class PrefixCache:
    """Prefills by prompt, bounded in bytes, least recently used evicted first.

    Args:
        max_bytes: the bound; ``0`` keeps nothing (every prompt is prefilled).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must not be negative")
        self._max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], Prefill] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, prompt: tuple[int, ...]) -> Prefill | None:
        """The prompt's prefill if kept (it becomes the most recently used)."""
        found = self._entries.get(prompt)
        if found is not None:
            self._entries.move_to_end(prompt)
        return found

    def put(self, prompt: tuple[int, ...], prefill: Prefill) -> None:
        """Keep ``prefill``, evicting the least recently used prefills beyond the bound."""
        if prompt in self._entries:
            self._bytes -= self._entries.pop(prompt).nbytes
        self._entries[prompt] = prefill
        self._bytes += prefill.nbytes
        while self._entries and self._bytes > self._max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes

    def clear(self) -> None:
        """Forget every prefill (the weights changed)."""
        self._entries.clear()
        self._bytes = 0
