"""What the asyncio bridge costs: per call, and on a whole run at zero latency.

Run: ``.venv/bin/python bench/asyncio_bridge.py`` (``--quick`` for a 5x shorter run).

Per call (real time, one coroutine that returns at once, best of 5 rounds):

- ``direct``: ``await fn()``, the floor;
- ``never``: through :func:`trio_rl.asyncio_bridge.call_user` with no loop (``asyncio_bridge="never"``);
- ``auto, Trio code``: ``call_user`` deciding per call that a Trio-flavoured function runs natively;
- ``auto, asyncio code``: ``call_user`` running an asyncio coroutine as an asyncio task on the run's loop;
- ``asyncio code calling trio``: an asyncio coroutine awaiting a Trio coroutine
  through :class:`~trio_rl.DualSamplingClient` (``trio_as_aio``), net of the bridged call around it.

Determinism: two seeded runs of the asyncio envs under ``MockClock(autojump_threshold=0)``:
are their metrics identical, and is the order in which a group's envs took a
shared ``asyncio.Semaphore`` identical?

Per run: CPU seconds per group of a FakeDataset run (Trio envs) with
``asyncio_bridge="never"`` and ``"auto"``, and of the asyncio envs of
tests/asyncio_envs.py under ``"auto"`` (zero latencies, sync mode).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import asyncio_envs
from trio_rl import Config, DualSamplingClient, train
from trio_rl.asyncio_bridge import call_user, open_user_code_runner
from trio_rl.testing import FakeBackend, FakeDataset


async def trio_flavoured() -> int:
    await trio.lowlevel.checkpoint()
    return 1


class _Echo:
    async def sample(self, *args: Any) -> int:
        await trio.lowlevel.checkpoint()
        return 1


async def _time_calls(call: Callable[[], Awaitable[Any]], n: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(n):
            await call()
        best = min(best, (time.perf_counter() - started) / n)
    return best * 1e6


async def per_call(n: int) -> dict[str, float]:
    results: dict[str, float] = {}
    results["direct"] = await _time_calls(trio_flavoured, n)
    async with open_user_code_runner("never"):
        results["never"] = await _time_calls(lambda: call_user(trio_flavoured), n)
    async with open_user_code_runner("auto"):
        results["auto, Trio code"] = await _time_calls(lambda: call_user(trio_flavoured), n)
        results["auto, asyncio code"] = await _time_calls(
            lambda: call_user(asyncio_envs.asyncio_sleep_then_time, 0.0), n // 4
        )
        client = DualSamplingClient(_Echo())  # type: ignore[arg-type]
        both = await _time_calls(lambda: call_user(asyncio_envs.await_trio, client), n // 4)
        results["asyncio code calling trio"] = both - results["auto, asyncio code"]
    return results


def per_run(dataset_factory: Callable[[], Any], bridge: str, batches: int) -> float:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            config = Config(log_path=Path(tmp), eval_every=0, save_every=0, asyncio_bridge=bridge)  # type: ignore[arg-type]
            async with FakeBackend(record_calls=False) as backend:
                await train(config, dataset=dataset_factory(), backend=backend)

    best = float("inf")
    for _ in range(3):
        started = time.process_time()
        trio.run(main)
        best = min(best, time.process_time() - started)
    return best / (batches * 8) * 1e6


def seeded_asyncio_run(seed: int) -> tuple[list[dict[str, Any]], list[tuple[int, int, int]]]:
    """Metrics (wall-time keys dropped) and semaphore order of one seeded asyncio run in virtual time."""
    import trio.testing

    from trio_rl.rl.metrics import WALL_TIME_PREFIX

    dataset = asyncio_envs.AsyncioDataset(4, 4, delay=0.5, group_size=4)

    async def main() -> list[dict[str, Any]]:
        with tempfile.TemporaryDirectory() as tmp:
            config = Config(log_path=Path(tmp), eval_every=0, save_every=0, seed=seed)
            async with FakeBackend(seed=seed, sample_latency=1.0) as backend:
                result = await train(config, dataset=dataset, backend=backend)
        return [{k: v for k, v in r.items() if not k.startswith(WALL_TIME_PREFIX)} for r in result.metrics]

    metrics = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return metrics, dataset.log.gate_order


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 4000 if args.quick else 20000
    batches = 10 if args.quick else 50
    print(f"python {platform.python_version()} on {platform.machine()}")
    print("per call (us, best of 5):")
    for name, us in trio.run(per_call, n).items():
        print(f"  {name:28s} {us:8.2f}")
    runs = [seeded_asyncio_run(seed=5) for _ in range(5)]
    print("determinism, 5 seeded runs of asyncio envs under autojump:")
    print(f"  metrics identical            {all(r[0] == runs[0][0] for r in runs)}")
    print(f"  semaphore order identical    {all(r[1] == runs[0][1] for r in runs)}")
    print("per group, whole run at zero latency (CPU us, best of 3; 8 groups x 4 envs per step):")
    trio_data = lambda: FakeDataset(batches, 8)  # noqa: E731
    asyncio_data = lambda: asyncio_envs.AsyncioDataset(batches, 8, delay=0.0, group_size=4)  # noqa: E731
    print(f"  {'Trio envs, never':28s} {per_run(trio_data, 'never', batches):8.0f}")
    print(f"  {'Trio envs, auto':28s} {per_run(trio_data, 'auto', batches):8.0f}")
    print(f"  {'asyncio envs, auto':28s} {per_run(asyncio_data, 'auto', batches):8.0f}")


if __name__ == "__main__":
    main()
