"""The schedule of tinker-cookbook 0.6.1's async loop on the long-tail workload, in virtual time.

Run: ``.venv/bin/python bench/vs_cookbook/cookbook_schedule.py`` (``--steps``, ``--ks``, ``--draw``).

Not the cookbook's code: a re-enactment of its rules (``tinker_cookbook/rl/train.py``,
``do_async_training``) in Trio on :class:`~trio_rl.testing.FakeBackend`'s sampler
model, with no CPU cost, so that the cookbook's real-time makespans in the long-tail
cell (``run.py --longtail``) can be read against the schedule they would have on an
idle machine. The rules:

- ``groups_per_batch * (K + 1)`` rollout slots; groups start in dataset order, each
  once it holds a slot, on the newest published weights;
- a step waits for ``groups_per_batch`` completed groups, also takes every group
  completed by then, and trains the ``groups_per_batch`` sampled from the oldest
  weights; the rest carry over;
- the trained groups' slots are freed once the new weights are published.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import trio
import trio.testing
from tinker import types as tinker_types

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for bench.x, as in bench/longtail.py
from bench import longtail_workload as workload
from trio_rl import _tinker_compat as compat
from trio_rl.base.determinism import settle
from trio_rl.testing import FakeBackend, FakeSamplerModel, FakeSamplingClient


async def cookbook_schedule(steps: int, k: int, draw: int = 0) -> dict[str, float]:
    """Makespan, group staleness and token-weighted lag of 0.6.1's policy on the workload."""
    backend = FakeBackend(
        train_latency=workload.TRAIN_S,
        sampler=FakeSamplerModel(
            slots=workload.SAMPLE_SLOTS,
            token_latency=workload.TOKEN_LATENCY_S,
            response_length=functools.partial(workload.response_length, draw=draw),
        ),
    )
    training = await backend.create_training_client(base_model="fake")
    per_step = workload.GROUPS_PER_STEP
    # The dataloader reads these when it hands out a group; the training loop below rebinds them.
    latest_client = await backend.create_sampling_client(base_model="fake")
    latest_step = 0
    slots = trio.Semaphore(per_step * (k + 1))
    done_send, done_receive = trio.open_memory_channel[tuple[int, int, int]](float("inf"))
    params = tinker_types.SamplingParams(max_tokens=workload.MAX_TOKENS)

    async def rollout(batch: int, group: int, client: FakeSamplingClient, step: int) -> None:
        async def one(index: int) -> None:
            await client.sample(compat.model_input_from_ints(workload.env_prompt(batch, group, index)), 1, params)

        async with trio.open_nursery() as nursery:
            for index in range(workload.GROUP_SIZE):
                nursery.start_soon(one, index)
        done_send.send_nowait((step, batch, group))

    async def dataloader(nursery: trio.Nursery) -> None:
        for batch in range(steps):
            for group in range(per_step):
                await slots.acquire()
                nursery.start_soon(rollout, batch, group, latest_client, latest_step)

    started = trio.current_time()
    trained: list[tuple[int, int, int]] = []  # (staleness, batch, group)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(dataloader, nursery)
        completed: list[tuple[int, int, int]] = []
        for step in range(steps):
            while len(completed) < per_step:
                completed.append(await done_receive.receive())
            await settle()
            while True:
                try:
                    completed.append(done_receive.receive_nowait())
                except trio.WouldBlock:
                    break
            completed.sort()
            batch, completed = completed[:per_step], completed[per_step:]
            trained += [(step - sampled, b, g) for sampled, b, g in batch]
            await (await training.forward_backward([], "importance_sampling")).result()
            await (await training.optim_step(tinker_types.AdamParams(learning_rate=1e-4))).result()
            latest_client = await training.save_weights_for_sampler(f"{step:06d}")
            latest_step = step + 1
            for _ in batch:
                slots.release()
        nursery.cancel_scope.cancel()
    makespan = trio.current_time() - started
    tokens: dict[tuple[int, int], int] = {}
    for sequence in backend.sequences:
        key = (sequence.prompt[0] - 1, sequence.prompt[1] - 2)
        tokens[key] = tokens.get(key, 0) + sequence.length
    staleness = [lag for lag, _, _ in trained]
    weighted = sum(lag * tokens[(b, g)] for lag, b, g in trained)
    return {
        "makespan_s": makespan,
        "limit_s": workload.sampler_bound_limit(steps, sum(workload.workload_lengths(steps, draw))),
        "staleness_mean": sum(staleness) / len(staleness),
        "staleness_max": max(staleness),
        "token_lag_mean": weighted / sum(tokens[(b, g)] for _, b, g in trained),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=workload.STEPS)
    parser.add_argument("--ks", default="1,2,4,8")
    parser.add_argument("--draw", type=int, default=0)
    args = parser.parse_args()
    print(
        f"{'K':>2} {'makespan s':>10} {'limit s':>8} {'ratio':>6} {'stale mean':>10} {'stale max':>9} {'lag mean':>8}"
    )
    for k in (int(k) for k in args.ks.split(",")):
        row = trio.run(cookbook_schedule, args.steps, k, args.draw, clock=trio.testing.MockClock(autojump_threshold=0))
        print(
            f"{k:>2} {row['makespan_s']:>10.1f} {row['limit_s']:>8.1f} {row['makespan_s'] / row['limit_s']:>6.2f} "
            f"{row['staleness_mean']:>10.2f} {row['staleness_max']:>9} {row['token_lag_mean']:>8.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
