"""What both sides of bench/vs_trl share: the matched settings, the problems, the result line."""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for _path in (ROOT, ROOT / "examples"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

GROUPS = 4  # prompts per step
GROUP_SIZE = 8  # samples per prompt
MAX_TOKENS = 6
LORA_RANK = 8
LORA_ALPHA = 32.0  # HFBackend's default
LEARNING_RATE = 2e-4
ADAM_BETAS = (0.9, 0.95)  # trio_rl's Config defaults
ADAM_EPS = 1e-8
THREADS = 2


def example_args(seed: int, steps: int) -> Any:
    """The SmolLM2 example's flags for this run (its problems, prompts and rewards are the task)."""
    import smollm2_addition as ex

    from trio_rl.cli import parse_args

    return parse_args(ex.Args, ["--seed", str(seed), "--max-steps", str(steps)])


def step_problems(args: Any, renderer: Any, steps: int) -> list[list[tuple[int, int]]]:
    """The (a, b) of each step's groups, exactly as the example's dataset draws them."""
    import smollm2_addition as ex

    dataset = ex.AdditionDataset(args, renderer, num_batches=steps)

    def operands(group: object) -> tuple[int, int]:
        if not isinstance(group, ex.AdditionGroupBuilder):
            raise TypeError(f"the example's dataset built a {type(group).__name__}, not an AdditionGroupBuilder")
        return group.a, group.b

    return [[operands(g) for g in dataset.get_batch(i)] for i in range(steps)]


def report(side: str, seed: int, sample_s: list[float], train_s: list[float], rewards: list[float], **extra: Any) -> None:
    """Print the run's one JSON result line (the driver reads the last line that starts with '{')."""
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    line = {
        "side": side,
        "seed": seed,
        "sample_s": sample_s,
        "train_s": train_s,
        "rewards": rewards,
        "peak_rss_mb": round(peak_mb, 1),
        "load": os.getloadavg()[0],
        **extra,
    }
    print(json.dumps(line), flush=True)
