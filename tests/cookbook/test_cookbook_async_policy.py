"""trio_rl's "oldest_first" policy against tinker-cookbook 0.6.1's real ``do_async_training``, step by step.

Both loops run the identical long-tail work (``bench/longtail_workload.py``: 8
groups x 8 samples per step, lognormal response lengths fixed by each prompt,
a sampler of 128 slots at 0.5 ms per token, ``forward_backward`` 0.1 s), so
there are stragglers at every K. The cookbook side is its own loop, called as
``bench/vs_cookbook/cookbook_side.py`` calls it, on that benchmark's fake Tinker
service, run on an asyncio event loop whose clock is virtual: a sleep advances
the clock instead of waiting, so the schedule is exact and independent of the
machine's load. The trio_rl side runs under ``MockClock``. The groups each
training step trains must be the same on both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import selectors
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from bench import longtail
from bench.longtail_workload import GROUP_SIZE, GROUPS_PER_STEP, MAX_TOKENS, TRAIN_S
from bench.vs_cookbook import cookbook_side
from trio_rl import AsyncConfig, Config, train
from trio_rl.testing import FakeDataset, FakeEnvSpec

Step = frozenset[tuple[int, int]]


class _VirtualSelector(selectors.DefaultSelector):
    """Polls for real I/O; when there is none and a timer is due, advances the loop's virtual clock to it."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:  # nothing scheduled: only real I/O (a thread's result) can wake the loop
            return super().select(None)
        self._loop.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` only moves when every task waits for a timer (as Trio's autojump)."""

    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_VirtualSelector(self))

    def time(self) -> float:
        return self.now


def cookbook_steps(steps: int, k: int, draw: int, log_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Step]:
    """The groups, as (batch, group), each step of 0.6.1's ``do_async_training`` trains on the long-tail work."""
    trained: list[Step] = []
    forward_backward = cookbook_side.FakeTrainingClient.forward_backward

    def recording(self: Any, data: Any, loss_fn: str, loss_fn_config: Any = None) -> Any:
        # An env's prompt starts with [1 + batch, 2 + group].
        trained.append(frozenset((d.model_input.to_ints()[0] - 1, d.model_input.to_ints()[1] - 2) for d in data))
        return forward_backward(self, data, loss_fn, loss_fn_config)

    monkeypatch.setattr(cookbook_side.FakeTrainingClient, "forward_backward", recording)
    args = argparse.Namespace(
        mode="async", steps=steps, k=k, longtail=True, draw=draw, sample_s=0.0, train_s=TRAIN_S,
        groups_per_step=GROUPS_PER_STEP, group_size=GROUP_SIZE, seed=0,
    )  # fmt: skip
    log_path.mkdir()
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(cookbook_side.run(args, log_path))
    return trained


def trio_rl_steps(steps: int, k: int, draw: int, log_path: Path) -> list[Step]:
    """The same for ``trio_rl.train`` with ``AsyncConfig(k, 8)`` (the default policy), in virtual time."""

    async def main() -> list[Step]:
        backend = longtail.make_backend(draw)
        dataset = FakeDataset(steps, GROUPS_PER_STEP, FakeEnvSpec(group_size=GROUP_SIZE))
        config = Config(
            log_path=log_path,
            eval_every=0,
            save_every=0,
            max_tokens=MAX_TOKENS,
            async_config=AsyncConfig(k, GROUPS_PER_STEP),
        )
        with trio.fail_after(10_000):
            async with backend:
                await train(config, dataset=dataset, backend=backend)
        return [frozenset(map(tuple, call.detail["groups"])) for call in backend.calls_of("forward_backward")]

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


TIE_IN_THE_FINISH_ORDER = pytest.mark.xfail(
    strict=True,
    reason=(
        "groups (6, 5) and (7, 7) both sampled from version 0 finish at the same instant (0.8035 s); step 5 "
        "trains one of them: 0.6.1 the one asyncio's timer heap happened to run first, (7, 7), trio_rl the one "
        "first in dataset order, (6, 5), so that the choice never depends on a scheduler's order"
    ),
)


@pytest.mark.parametrize(
    ("k", "draw"),
    [(1, 0), (2, 0), (4, 0), pytest.param(8, 0, marks=TIE_IN_THE_FINISH_ORDER), (1, 1), (2, 1), (4, 1), (8, 1)],
)
def test_every_step_trains_the_same_groups_as_cookbook_0_6_1s_async_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, k: int, draw: int
) -> None:
    steps = 16
    theirs = cookbook_steps(steps, k, draw, tmp_path / "cookbook", monkeypatch)
    ours = trio_rl_steps(steps, k, draw, tmp_path / "trio_rl")
    everything = {(b, g) for b in range(steps) for g in range(GROUPS_PER_STEP)}
    assert set().union(*theirs) == everything and len(theirs) == steps
    # Stragglers: some step trains a group started before the previous step's groups.
    assert any(min(step) < max(previous) for previous, step in itertools.pairwise(theirs))
    assert ours == theirs
