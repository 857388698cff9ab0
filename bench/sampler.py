"""LocalBackend throughput: batched sampling against one request at a time, and a training step.

Not a test. Prints sampler tokens/s for 1, 8, 64 and 256 concurrent requests,
the same requests run one after another, and the ratio; then the time of one
``forward_backward`` + ``optim_step`` on a typical RL batch.

Run: .venv/bin/python bench/sampler.py
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

import trio
from tinker import types as tinker_types

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from trio_rl import _tinker_compat
from trio_rl.backends.local import LocalBackend, ModelConfig
from trio_rl.backends.local.sampler import LocalSamplingClient

CONCURRENCY = (1, 8, 64, 256)
MAX_TOKENS = 64
SEQUENTIAL_REQUESTS = 16  # one-at-a-time throughput does not depend on how many we time
TRAIN_BATCH = 64  # sequences per forward_backward
TRAIN_STEPS = 5


def _prompts(n: int, seed: int) -> list[tinker_types.ModelInput]:
    rng = random.Random(seed)
    return [
        tinker_types.ModelInput.from_ints([1, *(rng.randrange(3, 60) for _ in range(rng.randrange(8, 33)))])
        for _ in range(n)
    ]


def _params(i: int) -> tinker_types.SamplingParams:
    return tinker_types.SamplingParams(max_tokens=MAX_TOKENS, stop=[], seed=i)


async def _concurrent(sampler: LocalSamplingClient, n: int) -> float:
    prompts = _prompts(n, n)
    tokens = 0

    async def one(i: int) -> None:
        nonlocal tokens
        resp = await sampler.sample(prompts[i], 1, _params(i))
        tokens += len(resp.sequences[0].tokens)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i)
    return tokens / (time.perf_counter() - start)


async def _sequential(sampler: LocalSamplingClient, n: int) -> float:
    prompts = _prompts(n, 0)
    tokens = 0
    start = time.perf_counter()
    for i in range(n):
        resp = await sampler.sample(prompts[i], 1, _params(i))
        tokens += len(resp.sequences[0].tokens)
    return tokens / (time.perf_counter() - start)


async def _train_step_seconds(backend: LocalBackend) -> float:
    client = await backend.create_training_client(base_model="local", seed=0)
    rng = random.Random(0)
    data = []
    for _ in range(TRAIN_BATCH):
        n = rng.randrange(48, 97)  # prompt + completion
        seq = [1, *(rng.randrange(3, 60) for _ in range(n))]
        data.append(
            tinker_types.Datum(
                model_input=tinker_types.ModelInput.from_ints(seq[:-1]),
                loss_fn_inputs={
                    "target_tokens": _tinker_compat.tensor(seq[1:], "int64"),
                    "logprobs": _tinker_compat.tensor([-4.0] * n, "float32"),
                    "advantages": _tinker_compat.tensor([rng.uniform(-1, 1)] * n, "float32"),
                },
            )
        )
    adam = tinker_types.AdamParams(learning_rate=1e-4)
    await (await client.optim_step(adam)).result()  # warm-up
    start = time.perf_counter()
    for _ in range(TRAIN_STEPS):
        await client.forward_backward(data, "ppo")
        await (await client.optim_step(adam)).result()
    return (time.perf_counter() - start) / TRAIN_STEPS


async def main() -> None:
    config = ModelConfig()
    with tempfile.TemporaryDirectory() as log_dir:
        async with LocalBackend(log_dir=log_dir, model_config=config) as backend:
            trainer = await backend.create_training_client(base_model="local", seed=0)
            sampler = await trainer.save_weights_for_sampler("bench")
            await sampler.sample(_prompts(1, 0)[0], 1, _params(0))  # warm-up
            print(f"model {config}, vocab {backend.tokenizer.vocab_size}, {MAX_TOKENS} new tokens per request")
            sequential = await _sequential(sampler, SEQUENTIAL_REQUESTS)
            print(f"one at a time: {sequential:9.0f} tokens/s")
            for n in CONCURRENCY:
                rate = await _concurrent(sampler, n)
                print(f"{n:4d} concurrent: {rate:9.0f} tokens/s   {rate / sequential:6.1f}x one-at-a-time")
            seconds = await _train_step_seconds(backend)
            print(f"training step (forward_backward ppo + optim_step, {TRAIN_BATCH} seqs of 48-96 tokens): "
                  f"{seconds * 1000:.0f} ms")


if __name__ == "__main__":
    trio.run(main)
