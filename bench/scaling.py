"""Per-group cost as the batch grows, and memory per group in flight.

Run: ``.venv/bin/python bench/scaling.py`` (``--quick`` for smaller batches;
``--tuned-gc`` to apply :func:`trio_rl.tune_gc_for_training` first, as the command line does;
``--no-gc`` to switch the collector off).

1. CPU per group at zero latency for 50, 500 and 5,000 groups per batch (K=1),
   under "requeue" and "pace", over the same 20,000 groups at every size (at
   least three steps): a policy whose bookkeeping rescans what it holds would
   grow with the batch, and equal work keeps short runs from looking cheaper.
   ``--instructions`` counts instead the instructions per group under valgrind
   (50 and 500 groups per batch, the collector off): the work itself, which
   neither the machine's caches nor the garbage collector change.
2. Memory per group in flight: 5,000 groups of 4 single-turn envs, all waiting
   on a slow sampler at once (virtual time), measured with tracemalloc as the
   memory the run holds beyond an idle run's, divided by the groups in flight.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import trio
import trio.testing

from trio_rl import AsyncConfig, Config, train, tune_gc_for_training
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec

TOTAL_GROUPS = 20_000
"""Groups trained per measurement, whatever the batch size."""


async def run(config: Config, dataset: FakeDataset, backend: FakeBackend) -> None:
    async with backend:
        await train(config, dataset=dataset, backend=backend)


def cpu_per_group(groups_per_batch: int, staleness: str, steps: int) -> float:
    dataset = FakeDataset(steps, groups_per_batch, FakeEnvSpec(group_size=4))
    with tempfile.TemporaryDirectory() as tmp:
        config = Config(
            log_path=Path(tmp),
            eval_every=0,
            save_every=0,
            max_tokens=8,
            async_config=AsyncConfig(1, groups_per_batch, staleness),  # type: ignore[arg-type]
        )
        started = time.process_time()
        trio.run(run, config, dataset, FakeBackend(record_calls=False))
        return 1e6 * (time.process_time() - started) / dataset.total_groups


def instructions_per_group(groups_per_batch: int, staleness: str) -> float:
    """Instructions per group with the collector off: the difference between runs of 2 and 4 batches,
    so that start-up and imports cancel out (``valgrind --tool=callgrind``)."""
    counts = []
    for steps in (2, 4):
        code = f"import gc, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); gc.disable(); import scaling; " \
               f"scaling.cpu_per_group({groups_per_batch}, {staleness!r}, {steps})"  # fmt: skip
        done = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                               "-c", code], capture_output=True, text=True, check=True)  # fmt: skip
        match = re.search(r"Collected : (\d+)", done.stderr)
        if match is None:
            raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
        counts.append(int(match.group(1)))
    return (counts[1] - counts[0]) / (2 * groups_per_batch)


def memory_per_group_in_flight(groups: int) -> tuple[float, float]:
    """Bytes held per group while ``groups`` groups all wait on the sampler: in all, and
    the part allocated while the fakes' code ran (``trio_rl.testing``)."""
    held: list[tuple[int, int]] = []

    async def main(tmp: Path) -> None:
        backend = FakeBackend(sample_latency=1000.0, record_calls=False)
        dataset = FakeDataset(2, groups, FakeEnvSpec(group_size=4))
        config = Config(log_path=tmp, eval_every=0, save_every=0, max_tokens=8,
                        async_config=AsyncConfig(1, groups, "pace"))  # fmt: skip
        async with backend, trio.open_nursery() as nursery:
            before = tracemalloc.take_snapshot()
            nursery.start_soon(lambda: train(config, dataset=dataset, backend=backend))
            await trio.sleep(500.0)  # every group of the first two batches is waiting on its samples
            grown = tracemalloc.take_snapshot().compare_to(before, "traceback")
            held.append((sum(s.size_diff for s in grown), sum(s.size_diff for s in grown if _by_fakes(s.traceback))))
            nursery.cancel_scope.cancel()

    with tempfile.TemporaryDirectory() as tmp:
        tracemalloc.start(32)
        trio.run(main, Path(tmp), clock=trio.testing.MockClock(autojump_threshold=0))
        tracemalloc.stop()
    total, fakes = held[0]
    return total / (2 * groups), fakes / (2 * groups)


def _by_fakes(traceback: tracemalloc.Traceback) -> bool:
    """Whether it was allocated while fake code ran (the fake sampler's waits, the fake envs and
    their observations), as opposed to trio_rl's own pipeline, rollouts and policies."""
    return any(frame.filename.endswith(f"{os.sep}trio_rl{os.sep}testing.py") for frame in traceback)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tuned-gc", action="store_true", help="apply tune_gc_for_training() first")
    parser.add_argument("--no-gc", action="store_true", help="run with gc.disable(), to separate the collector's cost")
    parser.add_argument("--instructions", action="store_true", help="count instructions per group (needs valgrind)")
    args = parser.parse_args()
    if args.instructions:
        print(f"{'groups/batch':>12} {'requeue M instr/group':>22} {'pace M instr/group':>19}  (collector off)")
        for size in (50, 500):
            requeue, pace = (instructions_per_group(size, staleness) / 1e6 for staleness in ("requeue", "pace"))
            print(f"{size:>12} {requeue:>22.3f} {pace:>19.3f}")
        return
    if args.tuned_gc:
        tune_gc_for_training()
    if args.no_gc:
        gc.disable()
    sizes = [50, 500, 2000] if args.quick else [50, 500, 5000]
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, trio {trio.__version__}")
    collector = "off" if args.no_gc else "tune_gc_for_training()" if args.tuned_gc else "CPython defaults"
    print(f"garbage collector: {collector}")
    print(f"{'groups/batch':>12} {'requeue us/group':>17} {'pace us/group':>14}")
    for size in sizes:
        steps = max(3, TOTAL_GROUPS // size - 1)
        requeue = cpu_per_group(size, "requeue", steps)
        pace = cpu_per_group(size, "pace", steps)
        print(f"{size:>12} {requeue:>17.0f} {pace:>14.0f}")
    in_flight = 500 if args.quick else 2500
    per_group, by_fakes = memory_per_group_in_flight(in_flight)
    print(
        f"memory per group in flight ({2 * in_flight} groups of 4 envs waiting): {per_group / 1024:.1f} KB, "
        f"of which the fakes' (sampler waits, envs): {by_fakes / 1024:.1f} KB"
    )


if __name__ == "__main__":
    main()
