"""asyncio-flavoured envs and evaluators written the way tinker-cookbook writes them.

This module imports asyncio and not trio, so ``asyncio_bridge="auto"`` runs its
coroutines on the run's asyncio loop; tests/test_asyncio_bridge.py uses them.
Everything here uses asyncio primitives that fail under plain Trio: ``gather``,
``sleep``, ``create_task``, ``wait_for`` and a contended ``Semaphore``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tinker import types as tinker_types

from trio_rl import _tinker_compat as compat
from trio_rl.types import (
    ActionExtra,
    Env,
    EnvGroupBuilder,
    InitialObservationOverflow,
    Metrics,
    Observation,
    RLDataset,
    StepResult,
    StopCondition,
    Trajectory,
)


@dataclass
class AsyncioLog:
    """What the asyncio code saw, for the tests to assert on."""

    cancelled: list[str] = field(default_factory=list)
    extras: list[ActionExtra | None] = field(default_factory=list)
    finished_children: int = 0
    background: list[asyncio.Task[None]] = field(default_factory=list)
    loop_times: list[float] = field(default_factory=list)
    gate_order: list[tuple[int, int, int]] = field(default_factory=list)
    made: int = 0
    cleaned: int = 0


# One semaphore slot for all envs of a run: every step but one waits, so the
# contended path (which fails under plain Trio) is always taken.
_GATE_SLOTS = 1


class GatheringEnv(Env):
    """One step; ``step`` gathers two asyncio children, each sleeping ``delay`` s."""

    def __init__(self, key: tuple[int, int, int], log: AsyncioLog, delay: float, gate: asyncio.Semaphore | None) -> None:
        self.key = key
        self.log = log
        self.delay = delay
        self.gate = gate

    async def initial_observation(self) -> tuple[Observation, StopCondition] | InitialObservationOverflow:
        await asyncio.sleep(0)
        return compat.model_input_from_ints([1 + self.key[0], 2 + self.key[1], 3 + self.key[2]]), [0]

    async def _child(self, action: list[int]) -> float:
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.log.cancelled.append(f"child {self.key}")
            raise
        self.log.finished_children += 1
        return sum(1 for t in action if t % 2 == 0) / max(1, len(action))

    async def step(self, action: list[int], *, extra: ActionExtra | None = None) -> StepResult:
        self.log.extras.append(extra)
        self.log.loop_times.append(asyncio.get_running_loop().time())
        if self.gate is not None:
            async with self.gate:
                self.log.gate_order.append(self.key)
                await asyncio.sleep(min(0.1, self.delay))
        rewards = await asyncio.gather(self._child(action), self._child(list(reversed(action))))
        return StepResult(
            reward=sum(rewards) / 2,
            episode_done=True,
            next_observation=compat.model_input_from_ints([]),
            next_stop_condition=[0],
            metrics={"even_frac": rewards[0]},
            logs={"key": str(self.key)},
        )


class FailingEnv(GatheringEnv):
    """Raises ``KeyError`` from inside an asyncio child task."""

    async def step(self, action: list[int], *, extra: ActionExtra | None = None) -> StepResult:
        async def fail() -> None:
            await asyncio.sleep(0.01)
            raise KeyError(f"asyncio env {self.key} failed")

        await asyncio.gather(fail())
        raise AssertionError("unreachable")


class OverflowingEnv(GatheringEnv):
    """Env 0 of each group reports an over-long prompt instead of an observation."""

    async def initial_observation(self) -> tuple[Observation, StopCondition] | InitialObservationOverflow:
        if self.key[2] == 0:
            return InitialObservationOverflow(reward=-1.0, metrics={"stop/max_tokens": 1.0}, logs={"why": "too long"})
        return await super().initial_observation()


class AsyncioGroupBuilder(EnvGroupBuilder):
    """A group of ``env_type``; ``make_envs`` starts a fire-and-forget asyncio task, as some cookbook code does."""

    def __init__(
        self, key: tuple[int, int], log: AsyncioLog, env_type: type[GatheringEnv], delay: float, group_size: int
    ) -> None:
        self.key = key
        self.log = log
        self.env_type = env_type
        self.delay = delay
        self.group_size = group_size

    async def make_envs(self) -> Sequence[Env]:
        self.log.made += 1
        gate = asyncio.Semaphore(_GATE_SLOTS)
        loop = asyncio.get_running_loop()  # first, so that no coroutine is left unawaited without a loop
        self.log.background.append(loop.create_task(self._heartbeat()))
        return [self.env_type((*self.key, i), self.log, self.delay, gate) for i in range(self.group_size)]

    async def _heartbeat(self) -> None:
        try:
            await asyncio.sleep(10**9)
        except asyncio.CancelledError:
            self.log.cancelled.append(f"heartbeat {self.key}")
            raise

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        await asyncio.sleep(0)
        return [(0.0, {"group_size": len(trajectory_group)}) for _ in trajectory_group]

    async def cleanup(self) -> None:
        # Two asyncio steps: a cleanup cut short by the loop closing would not count.
        await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        self.log.cleaned += 1


class AsyncioDataset(RLDataset):
    """``num_batches`` batches of ``batch_size`` asyncio groups; batch ``b``'s children sleep ``delays[b]`` s."""

    def __init__(
        self,
        num_batches: int,
        batch_size: int,
        *,
        env_type: type[GatheringEnv] = GatheringEnv,
        delay: float = 1.0,
        delays: Sequence[float] | None = None,
        group_size: int = 2,
    ) -> None:
        self.num_batches = num_batches
        self.batch_size = batch_size
        self.log = AsyncioLog()
        self.env_type = env_type
        self.delays = list(delays) if delays is not None else [delay] * num_batches
        self.group_size = group_size

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [
            AsyncioGroupBuilder((index, g), self.log, self.env_type, self.delays[index], self.group_size)
            for g in range(self.batch_size)
        ]


class AsyncioEvaluator:
    """Samples through ``sample_async`` from asyncio, gathering several requests, as RLTestSetEvaluator does."""

    def __init__(self) -> None:
        self.clients: list[Any] = []

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        self.clients.append(sampling_client)
        params = tinker_types.SamplingParams(max_tokens=4, seed=1)
        prompt = compat.model_input_from_ints([1, 2, 3])
        responses = await asyncio.gather(
            *(sampling_client.sample_async(prompt=prompt, num_samples=1, sampling_params=params) for _ in range(3))
        )
        logprobs = await sampling_client.compute_logprobs_async(prompt)
        return {"test/asyncio_tokens": float(sum(len(r.sequences[0].tokens) for r in responses)), "test/lp": float(len(logprobs))}


async def wait_for_sample(client: Any, timeout: float) -> str:
    """Await a Trio-backed sample under an asyncio timeout; say how it ended."""
    params = tinker_types.SamplingParams(max_tokens=4, seed=1)
    try:
        await asyncio.wait_for(client.sample(compat.model_input_from_ints([1]), 1, params), timeout)
    except TimeoutError:
        return "timed out"
    return "finished"


async def asyncio_sleep_then_time(delay: float) -> float:
    """Sleep with asyncio; return the loop's clock afterwards."""
    await asyncio.sleep(delay)
    return asyncio.get_running_loop().time()


async def await_trio(client: Any) -> Any:
    """An asyncio coroutine awaiting a Trio one through a DualSamplingClient (for bench/asyncio_bridge.py)."""
    return await client.sample(None, 1, None)
