"""A small decoder-only transformer and the configuration that sizes it.

The same module serves training (float32, one causal pass over right-padded
sequences) and sampling (float64, a prefill pass and then one-token decode
steps that read and write a per-row key/value cache).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

KVCache = list[tuple[Tensor, Tensor]]
"""Per layer, keys and values shaped ``[batch, heads, slots, head_dim]``."""


@dataclass(frozen=True)
class ModelConfig:
    """Sizes of :class:`TransformerLM`; the vocabulary size comes from the tokenizer.

    The defaults give a model of about 100k parameters, small enough that two CPU
    cores train and sample it interactively.

    Args:
        d_model: width of the residual stream.
        n_layers: number of transformer blocks.
        n_heads: attention heads per block; must divide ``d_model``.
        d_ff: hidden width of each block's MLP.
        max_seq_len: longest sequence (prompt plus completion) the model accepts.
    """

    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    max_seq_len: int = 256

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive")
        if self.d_model % self.n_heads:
            raise ValueError("ModelConfig.n_heads must divide d_model")

    def to_json(self) -> str:
        """Serialise to JSON (read back with :meth:`from_json`)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        """Rebuild a configuration saved with :meth:`to_json`.

        Raises:
            ValueError: if ``text`` does not hold exactly this dataclass's fields.
        """
        data: Any = json.loads(text)
        names = {f.name for f in dataclasses.fields(cls)}
        if not isinstance(data, dict) or set(data) != names:
            raise ValueError(f"saved ModelConfig must have exactly the fields {sorted(names)}")
        return cls(**{k: int(v) for k, v in data.items()})


class _Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.d_model // config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.out = nn.Linear(config.d_model, config.d_model)

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        cache: tuple[Tensor, Tensor] | None,
        write_slots: Tensor | None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        batch, length, width = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        if cache is not None:
            assert write_slots is not None
            cache_k, cache_v = cache
            rows = torch.arange(batch)
            # Each row writes its new key/value at its own length, so rows of
            # different lengths share one cache tensor without left-padding.
            if write_slots.dim() == 1:  # a decode step
                cache_k[rows, :, write_slots] = k[:, :, 0]
                cache_v[rows, :, write_slots] = v[:, :, 0]
            else:  # a prefill past cached keys: [batch, length] slots
                cache_k[rows[:, None], :, write_slots] = k.transpose(1, 2)
                cache_v[rows[:, None], :, write_slots] = v.transpose(1, 2)
            k, v = cache_k, cache_v
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(batch, length, width)
        return self.out(y), (k, v)


class _Block(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = _Attention(config)
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff), nn.GELU(), nn.Linear(config.d_ff, config.d_model)
        )

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        cache: tuple[Tensor, Tensor] | None,
        write_slots: Tensor | None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        a, kv = self.attn(self.ln_attn(x), mask, cache, write_slots)
        x = x + a
        return x + self.mlp(self.ln_mlp(x)), kv


class TransformerLM(nn.Module):
    """A pre-LayerNorm decoder-only transformer with learned positions.

    Args:
        config: the sizes.
        vocab_size: number of token ids (the tokenizer's ``vocab_size``).
        seed: seeds a private ``torch.Generator`` for the initial weights, so
            that creating a model never touches the global torch RNG.
    """

    def __init__(self, config: ModelConfig, vocab_size: int, *, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.vocab_size = vocab_size
        # Built on the meta device so torch's default initialisers never draw
        # from the global RNG; reset_parameters then fills real storage.
        with torch.device("meta"):
            self.tok_emb = nn.Embedding(vocab_size, config.d_model)
            self.pos_emb = nn.Embedding(config.max_seq_len, config.d_model)
            self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
            self.ln_f = nn.LayerNorm(config.d_model)
            self.head = nn.Linear(config.d_model, vocab_size)
        self.to_empty(device="cpu")
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int) -> None:
        """Re-initialise every weight from ``seed`` (GPT-2 style: N(0, 0.02), zero biases)."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("bias"):
                    param.zero_()
                elif ".ln_" in name or name.startswith("ln_"):
                    param.fill_(1.0)
                else:
                    param.normal_(0.0, 0.02, generator=gen)

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        mask: Tensor,
        cache: KVCache | None = None,
        write_slots: Tensor | None = None,
    ) -> tuple[Tensor, KVCache]:
        """Compute next-token logits.

        Args:
            tokens: ``[batch, length]`` token ids.
            positions: ``[batch, length]`` position of each token in its sequence.
            mask: boolean attention mask broadcastable to ``[batch, heads, length, keys]``;
                ``True`` where a query may attend to a key.
            cache: the key/value cache to write the new tokens into and attend
                over (a decode step, or a prefill past cached keys); ``None`` to
                attend over ``tokens`` themselves.
            write_slots: the cache slot of each new token: ``[batch]`` for a
                decode step (each row's length), ``[batch, length]`` otherwise.

        Returns:
            ``[batch, length, vocab]`` logits and, per layer, the keys and values
            attended over (the prompt's, on a pass without a cache).
        """
        hidden, new_cache = self.hidden(tokens, positions, mask, cache, write_slots)
        return self.head(hidden), new_cache

    def hidden(
        self,
        tokens: Tensor,
        positions: Tensor,
        mask: Tensor,
        cache: KVCache | None = None,
        write_slots: Tensor | None = None,
    ) -> tuple[Tensor, KVCache]:
        """:meth:`forward` without the output head: ``[batch, length, d_model]`` final hidden
        states, so that a caller computes logits only at the positions it reads."""
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        new_cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, mask, None if cache is None else cache[i], write_slots)
            new_cache.append(kv)
        return self.ln_f(x), new_cache


def causal_mask(lengths: Tensor, width: int) -> Tensor:
    """A ``[batch, 1, width, width]`` mask: causal, and blind to right-padding.

    Padding queries still see key 0, so no softmax row is empty.
    """
    idx = torch.arange(width)
    causal = idx[None, :] <= idx[:, None]
    valid = idx[None, :] < lengths[:, None]
    return (causal[None, :, :] & valid[:, None, :]).unsqueeze(1)
