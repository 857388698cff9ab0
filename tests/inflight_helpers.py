"""Publishing in-flight weights between two chosen decode steps of an in-process engine, without sleeps.

The local engines run every torch job (decode steps, training-client jobs such
as a publish) under the backend's one-token ``CapacityLimiter``, and Trio hands
a released token to the first task parked on it. So a publish whose job is
parked on the limiter before step ``n`` ends runs after step ``n`` and before
step ``n + 1``, which the engine asks for only once step ``n`` has returned.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import trio
import trio.testing
from tinker import types as tinker_types

from trio_rl import _tinker_compat as compat


def publish_after_step(
    engine: Any,
    step: int,
    publish: Callable[[], Awaitable[Any]],
    limiter: trio.CapacityLimiter,
    nursery: trio.Nursery,
) -> list[Any]:
    """Make ``publish()`` run right after the engine's ``step``-th decode step, before the next one.

    Wraps the engine's ``_step``: when step ``step`` has run, still in its worker
    thread (which holds the limiter's one token), it starts ``publish`` as a task
    in ``nursery`` and waits until every task is blocked, by then that task's job
    on the limiter.

    Returns:
        A list that receives ``publish()``'s result once it has run.
    """
    original = engine._step
    steps = 0
    published: list[Any] = []

    async def run() -> None:
        published.append(await publish())

    async def queue() -> None:
        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        assert limiter.statistics().tasks_waiting >= 1, "the publish job is not parked on the limiter"

    def counted(admit: Any) -> Any:
        nonlocal steps
        result = original(admit)
        steps += 1
        if steps == step:
            trio.from_thread.run(queue)
        return result

    engine._step = counted
    return published


async def fresh_logprobs(snapshot: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    """Each of ``tokens``' logprobs from one forward pass of ``snapshot``'s weights over prompt and tokens."""
    scored = await snapshot.compute_logprobs(tinker_types.ModelInput.from_ints([*prompt, *tokens]))
    return [float(v) for v in scored[len(prompt) :] if v is not None]


async def span_a_publish(
    backend: Any,
    trainer: Any,
    prompts: Sequence[tuple[list[int], int]],
    *,
    train_one_step: Callable[[], Awaitable[None]],
    params: tinker_types.SamplingParams,
    after_step: int,
) -> tuple[list[tinker_types.SampleResponse], Any, Any]:
    """Sample ``prompts`` on a v0 in-flight client of ``trainer`` while v1 is published after ``after_step`` steps.

    Args:
        backend: a local engine's backend (its ``_runtime.limiter`` is the engine's).
        trainer: its training client, at version 0.
        prompts: each prompt's tokens, and how many samples to draw from it.
        train_one_step: makes v1 (a pinned snapshot of v0 is taken before it).

    Returns:
        The responses in ``prompts``' order, and pinned snapshots of v0 and v1.
    """
    inflight = await trainer.save_weights_for_sampler("000000", inflight=True)
    v0 = await trainer.create_sampling_client()
    await train_one_step()
    v1 = await trainer.create_sampling_client()
    responses: dict[int, tinker_types.SampleResponse] = {}

    async def one(i: int, prompt: list[int], samples: int) -> None:
        responses[i] = await inflight.sample(tinker_types.ModelInput.from_ints(prompt), samples, params)

    async with trio.open_nursery() as nursery:
        published = publish_after_step(
            inflight._engine,
            after_step,
            lambda: trainer.save_weights_for_sampler("000001", inflight=True),
            backend._runtime.limiter,
            nursery,
        )
        for i, (prompt, samples) in enumerate(prompts):
            nursery.start_soon(one, i, prompt, samples)
    assert len(published) == 1
    return [responses[i] for i in range(len(prompts))], v0, v1


async def train_one_large_step(trainer: Any, tokens: list[int], targets: list[int]) -> None:
    """One cross-entropy step at learning rate 0.05 on one datum, so the next weights sample visibly differently."""
    datum = tinker_types.Datum(
        model_input=tinker_types.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": compat.tensor(targets, "int64"),
            "weights": compat.tensor([1.0] * len(targets), "float32"),
        },
    )
    await (await trainer.forward_backward([datum], "cross_entropy")).result()
    await (await trainer.optim_step(tinker_types.AdamParams(learning_rate=0.05))).result()
