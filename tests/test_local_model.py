"""TransformerLM: seeded init, and cached decoding equals a full causal pass."""

from __future__ import annotations

import pytest
import torch

from trio_rl.backends.local import ModelConfig
from trio_rl.backends.local.model import TransformerLM, causal_mask

CONFIG = ModelConfig(d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=32)


def test_init_is_seeded_and_leaves_global_rng_alone() -> None:
    state = torch.random.get_rng_state()
    a, b, c = (TransformerLM(CONFIG, 11, seed=s) for s in (1, 1, 2))
    assert torch.equal(torch.random.get_rng_state(), state)
    for (name, x), y, z in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(x, y)
        if name.endswith("weight") and x.dim() == 2:
            assert not torch.equal(x, z)


def test_kv_cache_decode_matches_full_pass() -> None:
    model = TransformerLM(CONFIG, 11, seed=0).double().eval()
    gen = torch.Generator().manual_seed(0)
    lengths = torch.tensor([5, 2, 7])
    width = 10
    seqs = torch.randint(0, 11, (3, width), generator=gen)
    positions = torch.arange(width).expand(3, width)
    with torch.inference_mode():
        full, _ = model(seqs, positions, causal_mask(torch.full((3,), width), width))
        # Prefill the ragged prompts right-padded, then decode each row from its own length.
        _, kv = model(seqs[:, :7], positions[:, :7], causal_mask(lengths, 7))
        cache = [(torch.cat([k, k.new_zeros(3, 4, 3, 8)], 2), torch.cat([v, v.new_zeros(3, 4, 3, 8)], 2)) for k, v in kv]
        cur = lengths.clone()
        for _ in range(3):
            rows = torch.arange(3)
            tok = seqs[rows, cur]
            mask = (torch.arange(width)[None, :] <= cur[:, None])[:, None, None, :]
            logits, _ = model(tok[:, None], cur[:, None], mask, cache, write_slots=cur)
            torch.testing.assert_close(logits[:, 0], full[rows, cur], rtol=1e-10, atol=1e-10)
            cur = cur + 1


def test_config_validation_and_json() -> None:
    with pytest.raises(ValueError):
        ModelConfig(d_model=30, n_heads=4)
    assert ModelConfig.from_json(CONFIG.to_json()) == CONFIG
    with pytest.raises(ValueError):
        ModelConfig.from_json('{"d_model": 3}')
