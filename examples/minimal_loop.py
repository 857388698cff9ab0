"""The training loop itself, in one file: a nursery, three channels, four kinds of task.

    python examples/minimal_loop.py                    # async (K=1) and sync on FakeBackend, in virtual time
    python examples/minimal_loop.py --mode sync
    python examples/minimal_loop.py --crash-at-batch 3 # an env raises: see how the crash travels

trio_rl.train() runs this same shape with more care (staleness policies, minibatches,
checkpoints, evaluators, resume). Here every stage is spelled out:

    dataloader ──builders──▶ rollout_worker × N ──groups──▶ trainer ──publishes──▶ Weights
                                   ▲                                                  │
                                   └───────── wait for "version >= batch - K" ────────┘

End of data: the dataloader leaves its ``with builders_send:`` block, which closes
the channel. Each worker's ``async for`` then ends and it closes its clone of the
groups channel; when the last clone closes, the trainer's ``async for`` ends.
Nobody counts anything.

A crash: an exception in any task cancels the nursery. Every other task is
cancelled at its next ``await``, and the exception leaves ``trio.run`` inside an
``ExceptionGroup``, caught below with ``except*``.

FakeBackend (trio_rl.testing) answers after virtual latencies under a MockClock, so
the run takes no real time and the printed seconds show what overlap buys: async
training samples batch b+1 while batch b trains.
"""

from __future__ import annotations

import os
import signal
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

if __name__ == "__main__":
    # Ctrl-C (or SIGTERM) while the imports below load (torch takes seconds) ends the
    # process at once with 130 (143): nothing has started, and an exception raised
    # here can land in the import machinery, which ignores it and may then hang.
    # Once the run starts, trio_rl.cli handles both signals.
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(143))

import trio
import trio.testing
import tyro
from tinker import types as tinker_types

from trio_rl import (
    EnvGroupBuilder,
    SamplingClient,
    SamplingPolicy,
    TrainingClient,
    TrajectoryGroup,
    assemble_training_data,
    derive_seed,
    do_group_rollout,
)
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec


@dataclass
class Args:
    """Flags of the minimal loop (every field is a ``--flag``)."""

    mode: Literal["sync", "async", "both"] = "both"
    """sync: batch b samples from the weights of step b; async: from step b - K or later; both: one of each"""
    max_steps_off_policy: int = 1
    """async: K, how many steps behind the trainer a batch's weights may be"""
    steps: int = 10
    """training steps: the dataset has this many batches"""
    groups_per_batch: int = 4
    """groups per batch (per training step)"""
    group_size: int = 4
    """rollouts per group; advantages are centred within a group"""
    num_workers: int = 8
    """concurrent rollout workers"""
    learning_rate: float = 1e-4
    """Adam learning rate"""
    sample_latency: float = 1.0
    """virtual seconds per sampling call"""
    train_latency: float = 1.0
    """virtual seconds per forward_backward"""
    crash_at_batch: int | None = None
    """make the first group of this batch raise inside a rollout"""
    seed: int = 0
    """seed of every rollout's sampling"""


class Weights:
    """The newest sampling client and its version; waiters wake on a fresh Event per version."""

    def __init__(self, client: SamplingClient) -> None:
        self.version, self.client = 0, client
        self._changed = trio.Event()

    def publish(self, client: SamplingClient) -> None:
        self.version, self.client = self.version + 1, client
        # Set the old event and swap in a new one: trio.Event has no clear(), on purpose.
        self._changed.set()
        self._changed = trio.Event()

    async def at_least(self, version: int) -> tuple[int, SamplingClient]:
        while self.version < version:
            await self._changed.wait()
        return self.version, self.client


Item = tuple[int, int, EnvGroupBuilder]
"""(batch, group, builder): identities travel with the work, so order never decides data."""
Finished = tuple[int, int, TrajectoryGroup]
"""(batch, weights version it sampled from, group)."""


async def dataloader(dataset: FakeDataset, builders_send: trio.MemorySendChannel[Item]) -> None:
    with builders_send:  # closing it is the end of data for the workers
        for batch in range(len(dataset)):
            for group, builder in enumerate(dataset.get_batch(batch)):
                await builders_send.send((batch, group, builder))


async def rollout_worker(
    args: Args,
    k: int,
    weights: Weights,
    builders_recv: trio.MemoryReceiveChannel[Item],
    groups_send: trio.MemorySendChannel[Finished],
) -> None:
    params = tinker_types.SamplingParams(max_tokens=8, temperature=1.0)
    with builders_recv, groups_send:  # this worker's clones: closed when it leaves, even on a crash
        async for batch, group, builder in builders_recv:
            version, client = await weights.at_least(batch - k)
            seed = derive_seed(args.seed, batch, group)  # from the item's identity, never from timing

            def policy_for(env: int, attempt: int, client: SamplingClient = client, seed: int = seed) -> SamplingPolicy:
                return SamplingPolicy(client, params, seed=derive_seed(seed, env, attempt))

            await groups_send.send((batch, version, await do_group_rollout(builder, policy_for)))


async def trainer(
    args: Args, training: TrainingClient, weights: Weights, groups_recv: trio.MemoryReceiveChannel[Finished]
) -> list[float]:
    """Train batch after batch in order; return each step's mean reward."""
    adam = tinker_types.AdamParams(learning_rate=args.learning_rate, beta1=0.9, beta2=0.95, eps=1e-8)
    waiting: dict[int, list[tuple[int, TrajectoryGroup]]] = defaultdict(list)
    rewards: list[float] = []
    with groups_recv:
        async for batch, version, group in groups_recv:  # ends when the last worker has closed its clone
            waiting[batch].append((version, group))
            while len(waiting[len(rewards)]) == args.groups_per_batch:
                step = len(rewards)
                arrived = waiting.pop(step)
                groups = [g for _, g in arrived]
                data = assemble_training_data(groups, "importance_sampling")
                # Submit both requests before waiting: the service runs them in order.
                fwd = await training.forward_backward(data, "importance_sampling")
                opt = await training.optim_step(adam)
                await fwd.result()
                await opt.result()
                weights.publish(await training.save_weights_for_sampler(f"step_{step + 1}"))
                totals = [r for g in groups for r in g.get_total_rewards()]
                rewards.append(sum(totals) / len(totals))
                staleness = max(step - v for v, _ in arrived)
                print(
                    f"  step {step:2d}  reward {rewards[-1]:.3f}  staleness {staleness}  t={trio.current_time():5.1f}s"
                )
    return rewards


async def train(args: Args, mode: Literal["sync", "async"], backend: FakeBackend) -> list[float]:
    """One run: build the channels, start every stage in one nursery, return the rewards."""
    spec = FakeEnvSpec(group_size=args.group_size)
    if args.crash_at_batch is not None:
        spec.fail_at[(args.crash_at_batch, 0)] = "step"
    dataset = FakeDataset(num_batches=args.steps, batch_size=args.groups_per_batch, spec=spec)
    k = args.max_steps_off_policy if mode == "async" else 0
    async with backend:
        training = await backend.create_training_client(base_model="fake", seed=args.seed)
        weights = Weights(await training.save_weights_for_sampler("step_0"))
        builders_send, builders_recv = trio.open_memory_channel[Item](0)
        # Unbounded: a finished group never waits for the trainer (admission bounds it anyway).
        groups_send, groups_recv = trio.open_memory_channel[Finished](float("inf"))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dataloader, dataset, builders_send)
            # Each worker gets its own clones; the originals close here, or the trainer would never see the end.
            with builders_recv, groups_send:
                for _ in range(args.num_workers):
                    nursery.start_soon(rollout_worker, args, k, weights, builders_recv.clone(), groups_send.clone())
            return await trainer(args, training, weights, groups_recv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the modes asked for; return 0, or 1 after a crash (printed, not a traceback)."""
    args = tyro.cli(Args, args=argv, description=__doc__.splitlines()[0])
    modes: list[Literal["sync", "async"]] = ["sync", "async"] if args.mode == "both" else [args.mode]
    for mode in modes:
        print(f"{mode}:")
        clock = trio.testing.MockClock(autojump_threshold=0)  # virtual time: sleeps jump when all tasks wait
        backend = FakeBackend(seed=args.seed, sample_latency=args.sample_latency, train_latency=args.train_latency)
        rewards: list[float] = []
        try:
            rewards = trio.run(train, args, mode, backend, clock=clock)
        except* RuntimeError as group:
            # Each nursery on the way out wraps the error once more; the original is the leaf.
            for error in leaves(group):
                print(f"  crashed at t={clock.current_time():.1f}s: {error!r}; every other task was cancelled")
        if len(rewards) < args.steps:
            return 1
        print(f"  {len(rewards)} steps in {clock.current_time():.1f} virtual seconds")
    return 0


def leaves(error: BaseException) -> list[BaseException]:
    """The original exceptions inside (nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


if __name__ == "__main__":
    sys.exit(main())
