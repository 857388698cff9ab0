"""HFBackend's training step on the matched SmolLM2 batch, shared prompts run once against every datum whole.

The batch of ``bench/vs_trl``: 4 problems of ``examples/smollm2_addition.py``
through its chat template, 8 answers each (numbers and a few longer
sentences, at most 6 tokens), importance sampling with centred advantages,
LoRA rank 8, 2 torch threads. Each repeat times one ``forward_backward`` plus
``optim_step`` with shared prefixes on, then off (in alternating order), in one
process, so load from other processes hits both about alike. Prints one line
per repeat and a JSON summary (median seconds) with the load average.

    PYTHONPATH=$PWD python bench/hf_train_prefix.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from tinker import types as tinker_types

from trio_rl import _tinker_compat as compat

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "examples"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

GROUPS, GROUP_SIZE, MAX_TOKENS, LORA_RANK, THREADS = 4, 8, 6, 8, 2


def batch(tokenizer: Any, seed: int) -> list[tinker_types.Datum]:
    """The matched task's training batch: each answer's tokens after its prompt, advantages centred per group."""
    import smollm2_addition as ex

    rng = random.Random(seed)
    renderer = ex.ChatRenderer(tokenizer, ex.Args.system_prompt)
    end = int(tokenizer.eos_token_id)
    data = []
    for _ in range(GROUPS):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        prompt = renderer.prompt(a, b)[0].to_ints()
        answers = [str(rng.randint(0, 18)) if rng.random() < 0.7 else f"The sum is {a + b}" for _ in range(GROUP_SIZE)]
        answers_tokens = [[*tokenizer.encode(t, add_special_tokens=False), end][:MAX_TOKENS] for t in answers]
        rewards = [float(t == str(a + b)) for t in answers]
        mean = sum(rewards) / len(rewards)
        for tokens, reward in zip(answers_tokens, rewards, strict=True):
            seq = prompt + tokens
            n, asked = len(seq) - 1, len(prompt) - 1
            data.append(
                tinker_types.Datum(
                    model_input=tinker_types.ModelInput.from_ints(seq[:-1]),
                    loss_fn_inputs={
                        "target_tokens": compat.tensor(seq[1:], "int64"),
                        "logprobs": compat.tensor([0.0] * asked + [-0.5] * (n - asked), "float32"),
                        "advantages": compat.tensor([0.0] * asked + [reward - mean + 0.1] * (n - asked), "float32"),
                    },
                )
            )
    return data


async def main(args: argparse.Namespace) -> None:
    from trio_rl.backends.hf import HFBackend
    from trio_rl.backends.hf import training as hf_training

    shared_min = hf_training.MIN_SHARED_PREFIX
    adam = tinker_types.AdamParams(learning_rate=2e-4, beta1=0.9, beta2=0.95, eps=1e-8)
    times: dict[str, list[float]] = {"shared": [], "whole": []}
    with tempfile.TemporaryDirectory() as tmp:
        async with HFBackend(log_dir=tmp, num_threads=THREADS) as backend:
            trainer = await backend.create_training_client(base_model=args.model, lora_rank=LORA_RANK, seed=0)
            data = batch(await trainer.get_tokenizer(), args.seed)
            lengths = [d.model_input.length for d in data]
            print(f"{len(data)} data of {min(lengths)}-{max(lengths)} tokens", flush=True)
            for repeat in range(args.repeats + 1):  # the first is a warm-up, not counted
                order = ["shared", "whole"] if repeat % 2 == 0 else ["whole", "shared"]
                line = []
                for mode in order:
                    hf_training.MIN_SHARED_PREFIX = shared_min if mode == "shared" else 10**9
                    start = time.perf_counter()
                    await (await trainer.forward_backward(data, "importance_sampling")).result()
                    await (await trainer.optim_step(adam)).result()
                    seconds = time.perf_counter() - start
                    line.append(f"{mode} {seconds:.2f} s")
                    if repeat:
                        times[mode].append(seconds)
                print(f"repeat {repeat}: {', '.join(line)} (load {os.getloadavg()[0]:.2f})", flush=True)
    hf_training.MIN_SHARED_PREFIX = shared_min
    summary = {mode: round(statistics.median(t), 3) for mode, t in times.items()}
    print(
        json.dumps({**summary, "speedup": round(summary["whole"] / summary["shared"], 2), "load": os.getloadavg()[0]})
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    trio.run(main, parser.parse_args())
