"""Measure how much batch composition changes the sampler's numbers, float32 vs float64.

Not a test. For random prompts, compares one row's next-token logprobs computed
alone against the same row computed in a batch with 7 other prompts of different
lengths (so the padded width and the matmul shapes differ), through the same
prefill + cached-decode path the sampler uses. Reports, per dtype, the largest
difference and how many float32-rounded logprobs are not bit-identical.

Run: .venv/bin/python bench/batch_noise.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from trio_rl.backends.local import ModelConfig
from trio_rl.backends.local.model import TransformerLM, causal_mask

TRIALS = 50
DECODE_STEPS = 8


def run(model: TransformerLM, prompts: list[list[int]], steps: torch.Tensor) -> torch.Tensor:
    """Prefill ``prompts`` (right-padded), decode ``steps`` tokens; logprobs of row 0 per step."""
    lengths = torch.tensor([len(p) for p in prompts])
    width = int(lengths.max())
    tokens = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        tokens[i, : len(p)] = torch.tensor(p)
    logits, kv = model(tokens, torch.arange(width).expand(len(prompts), width), causal_mask(lengths, width))
    out = [torch.log_softmax(logits[0, lengths[0] - 1], -1)]
    slots = width + DECODE_STEPS + 1
    cache = [(torch.cat([k, k.new_zeros(k.shape[0], k.shape[1], slots - width, k.shape[3])], 2),
              torch.cat([v, v.new_zeros(v.shape[0], v.shape[1], slots - width, v.shape[3])], 2)) for k, v in kv]
    cur = lengths.clone()
    for s in range(DECODE_STEPS):
        tok = steps[s].expand(len(prompts))
        mask = (torch.arange(slots)[None, :] <= cur[:, None])[:, None, None, :]
        logits, _ = model(tok[:, None], cur[:, None], mask, cache, write_slots=cur)
        out.append(torch.log_softmax(logits[0, 0], -1))
        cur = cur + 1
    return torch.stack(out)


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    base = TransformerLM(ModelConfig(), 80, seed=1)
    for dtype in (torch.float32, torch.float64):
        model = TransformerLM(ModelConfig(), 80, seed=1).to(dtype)
        model.load_state_dict(base.state_dict())
        max_diff, differ, total = 0.0, 0, 0
        with torch.inference_mode():
            for _ in range(TRIALS):
                lens = torch.randint(1, 60, (8,), generator=gen).tolist()
                prompts = [torch.randint(3, 80, (n,), generator=gen).tolist() for n in lens]
                steps = torch.randint(3, 80, (DECODE_STEPS,), generator=gen)
                alone = run(model, prompts[:1], steps)
                batched = run(model, prompts, steps)
                max_diff = max(max_diff, float((alone - batched).abs().max()))
                a32 = alone.to(torch.float32).numpy().view(np.int32)
                b32 = batched.to(torch.float32).numpy().view(np.int32)
                differ += int((a32 != b32).sum())
                total += a32.size
        print(f"{dtype!s:14s} max |alone - batched| = {max_diff:.3e}; "
              f"float32-rounded logprobs not bit-identical: {differ}/{total}")


if __name__ == "__main__":
    main()
