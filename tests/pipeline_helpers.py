"""Running the pipeline on fakes in virtual time, for the pipeline tests."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from trio_rl import AsyncConfig, Config, StreamMinibatchConfig, TrainResult, train
from trio_rl.loop.evaluation import SamplingClientEvaluator
from trio_rl.testing import FakeBackend, FakeDataset

RUN_DEADLINE_S = 10_000.0
"""Virtual seconds after which a run counts as hung; under autojump this fails at once."""

MODES: dict[str, dict[str, Any]] = {
    "sync": {},
    "stream": {"stream_minibatch_config": StreamMinibatchConfig(groups_per_batch=4, num_minibatches=2)},
    "requeue": {"async_config": AsyncConfig(max_steps_off_policy=1, groups_per_batch=4, staleness="requeue")},
    "pace": {"async_config": AsyncConfig(max_steps_off_policy=1, groups_per_batch=4, staleness="pace")},
    "oldest_first": {"async_config": AsyncConfig(max_steps_off_policy=1, groups_per_batch=4, staleness="oldest_first")},
}
"""Every mode, each with 4 groups per step."""


def make_config(log_path: Path, mode: str, **overrides: Any) -> Config:
    kwargs: dict[str, Any] = {"log_path": log_path, "eval_every": 0, "save_every": 0, **MODES[mode]}
    kwargs.update(overrides)
    return Config(**kwargs)


async def run_fake(
    config: Config,
    dataset: FakeDataset,
    backend: FakeBackend | None = None,
    evaluators: Sequence[SamplingClientEvaluator] = (),
) -> TrainResult:
    backend = backend or FakeBackend(sample_latency=1.0, train_latency=0.5)
    with trio.fail_after(RUN_DEADLINE_S):
        async with backend:
            return await train(config, dataset=dataset, backend=backend, evaluators=evaluators)


def straggling_group_1(request: Any) -> float:
    """A sample latency: group 1 of every batch takes 10 s, the others 1 s.

    The fake env's prompt encodes the group index. With K >= 1 the trainer moves
    on without the stragglers, so they arrive more than K steps stale.
    """
    prompt = request[0].to_ints()
    return 10.0 if prompt[1] - 2 == 1 else 1.0
