"""Pipeline overhead on FakeBackend in real time: makespan against the ideal schedule.

Run: ``.venv/bin/python bench/pipeline.py`` (add ``--quick`` for a 5x shorter run, and
``--tuned-gc`` to apply :func:`trio_rl.tune_gc_for_training` first, as the command line does).

Every cell trains 8 groups x 4 samples per step, single-turn, with ``trio.sleep``
latencies: S per sample call, T per forward_backward (optim_step and saving
weights take no time). Workers: one per group allowed in flight.

The ideal is the schedule with zero loop overhead. Step s can start training
when step s-1 has finished and its batch is sampled; its batch can start
sampling once the weights it may use exist, i.e. when step s-K-1 has finished::

    e_s = max(e_{s-1}, e_{s-K-1} + S) + T,  e_{<0} = 0,  ideal = e_{N-1}

For sync (K=0) this is N * (S + T). For async it is a lower bound under either
staleness policy, computed for the N steps the run actually trained.

Goals: makespan / ideal <= 1.05 in every cell; <= 600 CPU us per group at zero
latency with metrics.jsonl written.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from trio_rl import AsyncConfig, Config, train, tune_gc_for_training
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec

GROUPS_PER_STEP = 8
GROUP_SIZE = 4
LOSS_FN = "importance_sampling"
"""The loss every cell trains, sync and async alike. Async runs default to
``AsyncConfig.loss_fn`` ("stable_reinforce", tinker-cookbook 0.6.1's), whose datums
carry extra per-token inputs; pinning one loss keeps the cells comparable with each
other and with the benchmark's history, which trained this loss in every mode."""


@dataclass(frozen=True)
class Cell:
    name: str
    steps: int
    sample_s: float
    train_s: float


CELLS = [
    Cell("a: zero latency", 200, 0.0, 0.0),
    Cell("b: S=0.05 T=0.05", 50, 0.05, 0.05),
    Cell("c: S=0.2  T=0.02", 50, 0.2, 0.02),
    Cell("d: S=0.02 T=0.2", 50, 0.02, 0.2),
]

MODES: dict[str, dict[str, Any]] = {
    "sync": {},
    "async K=1 requeue": {"async_config": AsyncConfig(1, GROUPS_PER_STEP, "requeue", loss_fn=LOSS_FN)},
    "async K=1 pace": {"async_config": AsyncConfig(1, GROUPS_PER_STEP, "pace", loss_fn=LOSS_FN)},
    "async K=1 oldest_first": {"async_config": AsyncConfig(1, GROUPS_PER_STEP, "oldest_first", loss_fn=LOSS_FN)},
    "async K=1 inflight": {
        "async_config": AsyncConfig(1, GROUPS_PER_STEP, "oldest_first", loss_fn=LOSS_FN, inflight_weights=True)
    },
}


def ideal_makespan(steps: int, k: int, sample_s: float, train_s: float) -> float:
    ends: list[float] = []
    for s in range(steps):
        previous = ends[s - 1] if s >= 1 else 0.0
        weights_ready = ends[s - k - 1] if s - k - 1 >= 0 else 0.0
        ends.append(max(previous, weights_ready + sample_s) + train_s)
    return ends[-1] if ends else 0.0


async def run_cell(cell: Cell, mode: dict[str, Any], log_path: Path) -> dict[str, float]:
    backend = FakeBackend(sample_latency=cell.sample_s, train_latency=cell.train_s, record_calls=False)
    dataset = FakeDataset(cell.steps, GROUPS_PER_STEP, FakeEnvSpec(group_size=GROUP_SIZE, turns=1))
    config = Config(log_path=log_path, eval_every=0, save_every=0, max_tokens=8, **mode)
    samples = 0
    original_sample = None

    # Count sample calls without the fake's call log (which would add overhead).
    from trio_rl.testing import FakeSamplingClient

    original_sample = FakeSamplingClient.sample

    async def counting_sample(self: FakeSamplingClient, *args: Any, **kwargs: Any) -> Any:
        nonlocal samples
        samples += 1
        return await original_sample(self, *args, **kwargs)

    FakeSamplingClient.sample = counting_sample  # type: ignore[method-assign]
    try:
        wall = time.perf_counter()
        cpu = time.process_time()
        async with backend:
            result = await train(config, dataset=dataset, backend=backend)
        cpu = time.process_time() - cpu
        wall = time.perf_counter() - wall
    finally:
        FakeSamplingClient.sample = original_sample  # type: ignore[method-assign]
    k = mode["async_config"].max_steps_off_policy if "async_config" in mode else 0
    ideal = ideal_makespan(result.final_step, k, cell.sample_s, cell.train_s)
    used = result.trained_groups * GROUP_SIZE
    return {
        "steps": result.final_step,
        "makespan": wall,
        "ideal": ideal,
        "ratio": wall / ideal if ideal else float("nan"),
        "cpu_us_per_group": 1e6 * cpu / max(1, result.trained_groups),
        "wasted": samples - used,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5x fewer steps per cell")
    parser.add_argument("--tuned-gc", action="store_true", help="apply tune_gc_for_training() first")
    args = parser.parse_args()
    if args.tuned_gc:
        tune_gc_for_training()
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, trio {trio.__version__}"
    )
    print(f"garbage collector: {'tune_gc_for_training()' if args.tuned_gc else 'CPython defaults'}")
    print(
        f"{'cell':<18} {'mode':<18} {'steps':>5} {'makespan s':>10} {'ideal s':>8} {'ratio':>6} {'CPU us/group':>12} {'wasted':>6}"
    )
    for cell in CELLS:
        if args.quick:
            cell = Cell(cell.name, max(2, cell.steps // 5), cell.sample_s, cell.train_s)
        for mode_name, mode in MODES.items():
            with tempfile.TemporaryDirectory() as tmp:
                row = trio.run(run_cell, cell, mode, Path(tmp))
            ratio = "-" if cell.sample_s == cell.train_s == 0 else f"{row['ratio']:.3f}"
            print(
                f"{cell.name:<18} {mode_name:<18} {row['steps']:>5.0f} {row['makespan']:>10.3f} "
                f"{row['ideal']:>8.3f} {ratio:>6} {row['cpu_us_per_group']:>12.0f} {row['wasted']:>6.0f}"
            )


if __name__ == "__main__":
    main()
