"""The running rows of a Hugging Face sampling engine: their KV cache, attention mask, lengths and last tokens.

Rows are left-padded: each row's tokens end at the last column, so one decode
step appends one column for every row.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trio_rl.backends.local.prefix_cache import Prefill


def left_pad(t: Tensor, width: int, dim: int) -> Tensor:
    """Zero-pad ``t`` on the left of ``dim`` up to ``width``."""
    have = t.shape[dim]
    if have == width:
        return t
    shape = list(t.shape)
    shape[dim] = width - have
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def left_aligned_mask(lengths: list[int], width: int) -> Tensor:
    """``[rows, width]``: 1 on each row's last ``lengths[i]`` slots (its tokens, left-padded)."""
    return (torch.arange(width)[None, :] >= width - torch.tensor(lengths)[:, None]).long()


class RunningRows:
    """The decode batch of one engine on a HF model (a ``DynamicCache`` of ``[rows, kv_heads, width, head_dim]`` per layer).

    Args:
        device: where the model, hence the cache, lives.
    """

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self.clear()

    def clear(self) -> None:
        """No rows."""
        self.past: Any = None
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.lengths = torch.zeros(0, dtype=torch.long)
        self.last = torch.zeros(0, dtype=torch.long)

    def grown_mask(self, rows: int) -> Tensor:
        """The attention mask of the next decode step: one more column, for each row's last token."""
        return torch.cat([self.mask, torch.ones(rows, 1, dtype=torch.long)], dim=1)

    def stepped(self, mask: Tensor) -> None:
        """A decode step ran with ``mask`` (from :meth:`grown_mask`) and grew the cache by one column."""
        self.mask = mask
        self.lengths = self.lengths + 1

    def append(self, prefills: list[Prefill], repeats: list[int]) -> None:
        """Add ``repeats[i]`` rows of each prefilled prompt ``prefills[i]``, their last tokens still to come."""
        from transformers import DynamicCache

        width = max(p.length for p in prefills)
        index = torch.arange(len(prefills)).repeat_interleave(torch.tensor(repeats))
        mask = left_aligned_mask([p.length for p in prefills], width)
        sel = index.to(self._device)
        new = [
            tuple(torch.cat([left_pad(p.kv[layer][j], width, 2) for p in prefills])[sel] for j in (0, 1))
            for layer in range(len(prefills[0].kv))
        ]
        if self.past is None:
            self.past = DynamicCache()
            for layer, (keys, values) in enumerate(new):
                self.past.update(keys, values, layer)
            self.mask = mask[index]
        else:
            slots = max(self.mask.shape[1], width)
            for old, (keys, values) in zip(list(self.past.layers), new, strict=True):
                old.keys = torch.cat([left_pad(old.keys, slots, 2), left_pad(keys, slots, 2)])
                old.values = torch.cat([left_pad(old.values, slots, 2), left_pad(values, slots, 2)])
            self.mask = torch.cat([left_pad(self.mask, slots, 1), left_pad(mask[index], slots, 1)])
        self.lengths = torch.cat([self.lengths, torch.tensor([p.length for p in prefills])[index]])
        self.last = torch.cat([self.last, torch.zeros(len(index), dtype=torch.long)])

    def keep(self, keep: Tensor) -> None:
        """Keep only the rows ``keep`` indexes, in that order."""
        mask = self.mask.index_select(0, keep)
        # Cut the leading columns that only finished rows used.
        start = int(mask.any(0).long().argmax())
        self.mask = mask[:, start:]
        for layer in self.past.layers:
            sel = keep.to(layer.keys.device)
            layer.keys = layer.keys.index_select(0, sel)[:, :, start:]
            layer.values = layer.values.index_select(0, sel)[:, :, start:]
        self.lengths = self.lengths.index_select(0, keep)
        self.last = self.last.index_select(0, keep)
