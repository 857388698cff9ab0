"""Prefilled prompts kept for reuse, shared by prefix: a prompt prefills only what no kept prompt began with.

A :class:`PrefixCache` is a radix tree over prompt tokens, as SGLang's
RadixAttention keeps one. Each node holds the keys and values of a run of
tokens that follows its parent's, so prompts that share a prefix (a group's
prompt, sent once per env; a multi-turn env's turn-1 prompt inside its turn-2
prompt) store that prefix once. A node where a kept prompt ended also holds
that prompt's next-token logits, so the same prompt again needs no forward pass.

Keys and values of a prefix serve every prompt that begins with it: attention
is causal, so a position's keys and values depend only on the tokens up to it
(and on the weights: an engine samples from one set of weights, so its cache
never holds another's prefills; an engine whose weights change must
:meth:`PrefixCache.clear` it).

Looking a prompt up walks one node per branch point along it, comparing token
slices, so an admission costs about the prompt's length and not the number of
prompts kept. The cache is bounded in bytes (each token's keys and values are
counted once, however many kept prompts share them): least recently used nodes
go first. A lookup or insert marks its path used from the deepest node up to
the root, so a node is never older than any node below it, the least recently
used node is always a leaf, and evicting it returns its bytes at once.

:func:`look_up` reads the cache for an admission batch; the engine prefills the
prompts it did not find whole past their kept prefixes
(:meth:`~trio_rl.backends.local.decode_batch.DecodeBatch._prefill`) and
:meth:`PrefixCache.put` keeps them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from trio_rl.backends.local.requests import Request

DEFAULT_MAX_BYTES = 64 << 20
"""Default bound of one engine's cache: the keys and values of a few long prompts of a
SmolLM2-135M-sized model in float32, less the float64 next-token logits of each prompt kept whole."""

KV = list[tuple[Tensor, Tensor]]
"""Per layer, keys and values ``[1, heads, tokens, head_dim]`` of one token sequence."""


@dataclass(frozen=True)
class Prefill:
    """One prompt's prefill: per layer keys and values ``[1, heads, length, head_dim]``, and next-token logits."""

    kv: KV
    logits: Tensor

    @property
    def length(self) -> int:
        """The prompt's tokens."""
        return int(self.kv[0][0].shape[2])


@dataclass(frozen=True)
class CachedPrefix:
    """What a :class:`PrefixCache` holds of a prompt.

    Attributes:
        kv: per layer keys and values ``[1, heads, length, head_dim]`` of the
            prompt's first ``length`` tokens (an empty list when ``length`` is 0).
        length: the tokens covered: the whole prompt when ``logits`` is set,
            otherwise at most all but its last token (whose logits a forward
            pass must give).
        logits: the prompt's next-token logits, when the whole prompt was kept.
    """

    kv: KV
    length: int
    logits: Tensor | None


class _Node:
    """A run of tokens following its parent's, with their keys and values."""

    __slots__ = ("children", "kv", "logits", "nbytes", "parent", "tokens")

    def __init__(self, tokens: tuple[int, ...], kv: KV, logits: Tensor | None, parent: _Node | None) -> None:
        self.tokens = tokens
        self.kv = kv
        self.logits = logits
        self.parent = parent
        self.children: dict[int, _Node] = {}  # by first token
        self.nbytes = 0
        self.recount()

    def recount(self) -> None:
        """Set :attr:`nbytes` to the memory its tensors hold."""
        kv_bytes = sum(k.nbytes + v.nbytes for k, v in self.kv)
        self.nbytes = kv_bytes + (0 if self.logits is None else self.logits.nbytes)


def _slice(kv: KV, start: int, stop: int | None = None) -> KV:
    """Owned copies of tokens ``[start, stop)``: a view would keep the whole tensor alive unaccounted."""
    return [(k[:, :, start:stop].clone(), v[:, :, start:stop].clone()) for k, v in kv]


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` have alike (one slice comparison when one starts the other)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i in range(n) if a[i] != b[i])


class PrefixCache:
    """Prefilled prompts by shared prefix, bounded in bytes, least recently used evicted first.

    Args:
        max_bytes: the bound; ``0`` keeps nothing (every prompt is prefilled).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must not be negative")
        self._max_bytes = max_bytes
        self._root = _Node((), [], None, None)
        self._lru: OrderedDict[_Node, None] = OrderedDict()  # least recently used first; not the root
        self._bytes = 0

    def __len__(self) -> int:
        """How many whole prompts are kept (with their logits)."""
        return sum(node.logits is not None for node in self._lru)

    @property
    def nbytes(self) -> int:
        """Memory held by the kept keys, values and logits, each token's counted once."""
        return self._bytes

    def lookup(self, prompt: Sequence[int]) -> CachedPrefix:
        """The longest kept prefix of ``prompt`` (its nodes become the most recently used).

        Args:
            prompt: at least one token.

        Returns:
            The whole prompt with its logits if it was kept whole; otherwise
            the keys and values of its longest kept prefix of at most
            ``len(prompt) - 1`` tokens (none: length 0).
        """
        key = tuple(prompt)
        path, length, used = self._walk(key)
        self._touch(path)
        if path and length == len(key) and used == len(path[-1].tokens) and path[-1].logits is not None:
            return CachedPrefix(self._gather(path, length), length, path[-1].logits)
        length = max(0, min(length, len(key) - 1))
        return CachedPrefix(self._gather(path, length), length, None)

    def put(self, prompt: Sequence[int], prefill: Prefill) -> None:
        """Keep ``prompt``'s prefill, storing only the tokens no kept prompt covers; evict beyond the bound.

        Raises:
            ValueError: if ``prefill`` is not of ``prompt``'s length.
        """
        key = tuple(prompt)
        if not key or prefill.length != len(key):
            raise ValueError(f"a prefill of {prefill.length} tokens for a prompt of {len(key)}")
        if self._max_bytes == 0:
            return  # nothing would stay: skip the copies
        path, length, used = self._walk(key)
        if path and used < len(path[-1].tokens):
            path[-1] = self._split(path[-1], used)
        if length < len(key):
            parent = path[-1] if path else self._root
            leaf = _Node(key[length:], _slice(prefill.kv, length), prefill.logits.clone(), parent)
            parent.children[key[length]] = leaf
            self._lru[leaf] = None
            self._bytes += leaf.nbytes
            path.append(leaf)
        elif path[-1].logits is None:  # a strict prefix of a kept prompt: its keys and values are kept already
            end = path[-1]
            end.logits = prefill.logits.clone()
            self._bytes -= end.nbytes
            end.recount()
            self._bytes += end.nbytes
        self._touch(path)
        while self._bytes > self._max_bytes and self._lru:
            self._evict_oldest()

    def clear(self) -> None:
        """Forget every prefill (the weights changed)."""
        self._root = _Node((), [], None, None)
        self._lru.clear()
        self._bytes = 0

    # ------------------------------------------------------------------ tree

    def _walk(self, key: tuple[int, ...]) -> tuple[list[_Node], int, int]:
        """The nodes along ``key``'s longest kept prefix, that prefix's length, and the tokens of the last node in it."""
        path: list[_Node] = []
        node, length, used = self._root, 0, 0
        while length < len(key) and (child := node.children.get(key[length])) is not None:
            used = common_prefix_length(child.tokens, key[length : length + len(child.tokens)])
            path.append(child)
            length += used
            if used < len(child.tokens):
                break
            node = child
        return path, length, used

    def _touch(self, path: list[_Node]) -> None:
        # Deepest first: every ancestor ends up more recent than its descendants.
        for node in reversed(path):
            self._lru.move_to_end(node)

    def _gather(self, path: list[_Node], length: int) -> KV:
        """Keys and values of the first ``length`` tokens along ``path``, as new tensors."""
        parts: list[tuple[_Node, int]] = []
        for node in path:
            take = min(length, len(node.tokens))
            if take == 0:
                break
            parts.append((node, take))
            length -= take
        if not parts:
            return []

        def joined(layer: int, j: int) -> Tensor:
            return torch.cat([node.kv[layer][j][:, :, :take] for node, take in parts], dim=2)

        return [(joined(layer, 0), joined(layer, 1)) for layer in range(len(parts[0][0].kv))]

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node`` after its first ``at`` tokens; the new upper node, which takes its place."""
        parent = node.parent
        assert parent is not None and 0 < at < len(node.tokens)
        upper = _Node(node.tokens[:at], _slice(node.kv, 0, at), None, parent)
        parent.children[node.tokens[0]] = upper
        self._bytes -= node.nbytes
        node.tokens, node.kv, node.parent = node.tokens[at:], _slice(node.kv, at), upper
        node.recount()
        upper.children[node.tokens[0]] = node
        self._bytes += upper.nbytes + node.nbytes
        self._lru[upper] = None  # the caller touches it, with the rest of its path
        return upper

    def _evict_oldest(self) -> None:
        node, _ = self._lru.popitem(last=False)
        assert not node.children and node.parent is not None, "an evicted node is always a leaf"
        del node.parent.children[node.tokens[0]]
        self._bytes -= node.nbytes


def look_up(
    admit: list[Request], prefixes: PrefixCache
) -> tuple[dict[tuple[int, ...], Prefill], dict[tuple[int, ...], CachedPrefix]]:
    """What ``prefixes`` holds of each distinct prompt of an admission batch.

    Returns:
        The prefills of the prompts kept whole (no forward pass needed), and
        the longest kept prefixes of the others (empty ones included).

    Also sets each request's ``cached_tokens``: the prompt tokens whose keys and
    values it does not compute, those of its cached prefix, or all of them when
    an earlier request of this batch has the same prompt.
    """
    found: dict[tuple[int, ...], Prefill] = {}
    todo: dict[tuple[int, ...], CachedPrefix] = {}
    for request in admit:
        key = tuple(request.prompt)
        if key in found or key in todo:  # prefilled (or found) for an earlier request of this batch
            request.cached_tokens = len(key)
            continue
        cached = prefixes.lookup(key)
        request.cached_tokens = cached.length
        if cached.logits is not None:
            found[key] = Prefill(cached.kv, cached.logits)
        else:
            todo[key] = cached
    return found, todo
