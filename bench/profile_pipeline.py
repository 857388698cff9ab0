"""Where the pipeline's CPU goes: a profile of bench/pipeline.py's zero-latency cell, by category.

Run: ``.venv/bin/python bench/profile_pipeline.py [--mode sync|requeue|pace|oldest_first] [--steps N] [--cell a|b|c|d]``

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
    ("pydantic and tinker objects", ("/pydantic", "/tinker/", "trio_rl/_tinker_compat.py")),
    ("numpy", ("/numpy/",)),
    (
        "rollouts",
        ("trio_rl/rl/rollouts.py", "trio_rl/rl/termination.py", "trio_rl/base/determinism.py",
         "trio_rl/asyncio_bridge.py", "trio_rl/types.py"),
    ),
    ("datum assembly", ("trio_rl/rl/data.py", "trio_rl/rl/chunks.py", "trio_rl/rl/summary.py")),
    (
        "metrics and logging",
        ("trio_rl/rl/metrics.py", "trio_rl/loop/step_metrics.py", "trio_rl/loop/metrics_log.py",
         "trio_rl/base/reduced_metrics.py", "trio_rl/base/jsonl.py", "trio_rl/sinks.py", "/json/"),
    ),
    ("observation hooks", ("trio_rl/observe/",)),
    ("pipeline stages", ("trio_rl/loop/",)),
    ("fake backend and envs", ("trio_rl/testing/", "bench/pipeline.py")),
]  # fmt: skip
"""Each category's path fragments, tried in order: a file goes to the first that matches
(so "pipeline stages" takes what in ``trio_rl/loop/`` the ones above it did not)."""


def category(filename: str) -> str:
    for name, parts in CATEGORIES:
        if any(part in filename for part in parts):
            return name
    return "other (stdlib, builtins)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["sync", "requeue", "pace", "oldest_first"], default="oldest_first")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--cell", choices=["a", "b", "c", "d"], default="a", help="bench/pipeline.py's cell (a: zero latency)")
    args = parser.parse_args()
    mode = "sync" if args.mode == "sync" else f"async K=1 {args.mode}"
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
