"""Where the pipeline's CPU goes: a profile of bench/pipeline.py's zero-latency cell, by category.

Run: ``.venv/bin/python bench/profile_pipeline.py [--mode sync|requeue|pace] [--steps N] [--cell a|b|c|d]``

Time is attributed to the file of each function's own code (cProfile's ``tottime``),
then grouped: Trio's machinery, pydantic and tinker object construction, numpy,
trio_rl's rollouts, data assembly, metrics and logging, the pipeline's stages,
the fake backend and envs, and the rest.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for bench.x, as in bench/longtail.py
from bench import pipeline as bench

CATEGORIES = [
    ("trio", ("/trio/", "/outcome/", "sortedcontainers", "/attr/")),
    ("pydantic and tinker objects", ("/pydantic", "/tinker/", "_tinker_compat.py")),
    ("numpy", ("/numpy/",)),
    ("rollouts", ("trio_rl/rollouts.py", "trio_rl/determinism.py", "trio_rl/asyncio_bridge.py", "trio_rl/types.py")),
    ("datum assembly", ("trio_rl/data.py",)),
    ("metrics and logging", ("trio_rl/metrics.py", "trio_rl/step_metrics.py", "trio_rl/sinks.py", "/json/")),
    (
        "pipeline stages",
        ("trio_rl/pipeline.py", "trio_rl/schedule.py", "trio_rl/training_step.py", "trio_rl/ledger.py",
         "trio_rl/gate.py", "trio_rl/weights.py", "trio_rl/work.py", "trio_rl/checkpoint.py", "trio_rl/evaluation.py"),
    ),
    ("fake backend and envs", ("trio_rl/testing.py", "bench/pipeline.py")),
]  # fmt: skip


def category(filename: str) -> str:
    for name, parts in CATEGORIES:
        if any(part in filename for part in parts):
            return name
    return "other (stdlib, builtins)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["sync", "requeue", "pace"], default="requeue")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--cell", choices=["a", "b", "c", "d"], default="a", help="bench/pipeline.py's cell (a: zero latency)")
    args = parser.parse_args()
    mode = {"sync": "sync", "requeue": "async K=1 requeue", "pace": "async K=1 pace"}[args.mode]
    latencies = next(c for c in bench.CELLS if c.name.startswith(args.cell))
    cell = bench.Cell(latencies.name, args.steps, latencies.sample_s, latencies.train_s)
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(bench.run_cell, cell, bench.MODES[mode], Path(tmp) / "warm")  # imports and caches
        profile = cProfile.Profile(time.process_time)  # CPU, not the cells' sleeps
        started = time.process_time()
        profile.enable()
        row = trio.run(bench.run_cell, cell, bench.MODES[mode], Path(tmp) / "run")
        profile.disable()
        cpu = time.process_time() - started
    stats = pstats.Stats(profile)
    shares: dict[str, float] = defaultdict(float)
    total = 0.0
    for (filename, _, _), (_, _, tottime, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        shares[category(filename)] += tottime
        total += tottime
    groups = row["steps"] * bench.GROUPS_PER_STEP
    print(f"cell {cell.name}, mode {args.mode}, {row['steps']:.0f} steps, {groups:.0f} groups; CPU under the profiler {1e6 * cpu / groups:.0f} us/group")
    for name, seconds in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"{100 * seconds / total:5.1f}%  {name}")
    print()
    stats.sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
