"""Memory over a long run: 10,000 steps on FakeBackend, resident memory at 1k, 5k and 10k steps.

Run: ``.venv/bin/python bench/soak.py`` (``--steps N`` to change the length).

The run keeps no per-step history in memory (records stream to ``metrics.jsonl``),
so its resident set should stay flat once the first steps have warmed up the
interpreter. Each step trains 2 groups of 2 single-turn envs at zero latency,
with a checkpoint every 500 steps and the live metrics channel read by a host.
"""

from __future__ import annotations

import argparse
import gc
import platform
import tempfile
import time
from pathlib import Path

import trio

from trio_rl import Config, RunHandle, train
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvGroupBuilder, FakeEnvSpec


class _Discard(list[str]):
    def append(self, line: str) -> None:
        pass


class ForgetfulDataset(FakeDataset):
    """A FakeDataset that keeps neither its builders nor its event log (tests inspect those; a soak must not)."""

    def __init__(self, num_batches: int, batch_size: int, spec: FakeEnvSpec) -> None:
        super().__init__(num_batches, batch_size, spec)
        self.log = _Discard()

    def get_batch(self, index: int) -> list[FakeEnvGroupBuilder]:
        return [FakeEnvGroupBuilder((index, g), self.spec, self.log) for g in range(self.batch_sizes[index])]


def rss_mb() -> float:
    """The process's resident set now, in MB (Linux)."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * 4096 / 1e6


async def soak(steps: int, log_path: Path) -> list[tuple[int, float]]:
    config = Config(log_path=log_path, eval_every=0, save_every=500, max_tokens=4)
    dataset = ForgetfulDataset(steps, 2, FakeEnvSpec(group_size=2))
    marks = {1000, 5000, steps} | {s for s in (2000, 3000, 4000, 6000, 7000, 8000, 9000) if s < steps}
    readings: list[tuple[int, float]] = []
    async with FakeBackend(record_calls=False) as backend, trio.open_nursery() as nursery:
        handle: RunHandle = await nursery.start(
            lambda task_status: train(config, dataset=dataset, backend=backend, task_status=task_status)
        )
        async for record in handle.metrics:
            done = record["step"] + 1
            if "progress/groups" in record and done in marks:
                gc.collect()
                readings.append((done, rss_mb()))
    return readings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, trio {trio.__version__}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        readings = trio.run(soak, args.steps, Path(tmp))
    for step, mb in readings:
        print(f"step {step:>6}: RSS {mb:7.1f} MB")
    first = dict(readings)[1000] if 1000 in dict(readings) else readings[0][1]
    print(f"growth from step 1000 to {readings[-1][0]}: {readings[-1][1] - first:+.1f} MB in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
