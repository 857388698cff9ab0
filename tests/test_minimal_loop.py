"""examples/minimal_loop.py: the hand-built loop trains in both modes, ends at the end of data, and crashes cleanly."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest
import trio
import trio.testing

from trio_rl.testing import FakeBackend

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load() -> ModuleType:
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module("minimal_loop")


def run(mode: str, **flags: object) -> tuple[list[float], FakeBackend, float]:
    loop = load()
    args = loop.Args(**flags)
    backend = loop.FakeBackend(seed=args.seed, sample_latency=args.sample_latency, train_latency=args.train_latency)
    clock = trio.testing.MockClock(autojump_threshold=0)

    async def bounded() -> list[float]:
        with trio.fail_after(10_000):  # virtual seconds: a hang fails at once
            rewards: list[float] = await loop.train(args, mode, backend)
            return rewards

    rewards = trio.run(bounded, clock=clock)
    return rewards, backend, clock.current_time()


@pytest.mark.parametrize(("mode", "k"), [("sync", 0), ("async", 1)])
def test_every_batch_is_trained_from_weights_at_most_k_steps_old(
    mode: str, k: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rewards, backend, _ = run(mode, steps=6, groups_per_batch=3, group_size=2)
    # The end of data ended the run after the last batch: every group was trained, once.
    assert len(rewards) == 6 and all(0.0 <= r <= 1.0 for r in rewards)
    assert len(backend.calls_of("forward_backward")) == len(backend.calls_of("optim_step")) == 6
    assert [c.detail["data"] for c in backend.calls_of("forward_backward")] == [6] * 6
    assert [c.version for c in backend.calls_of("forward_backward")] == list(range(6))
    assert len(backend.calls_of("sample")) == 6 * 3 * 2
    staleness = [int(line.split("staleness")[1].split()[0]) for line in capsys.readouterr().out.splitlines()]
    assert len(staleness) == 6 and max(staleness) == k


def test_async_overlaps_sampling_with_training() -> None:
    _, _, sync_time = run("sync", steps=8)
    _, _, async_time = run("async", steps=8)
    assert sync_time == 8 * 2.0 and async_time < 0.6 * sync_time


def test_a_crash_in_a_rollout_cancels_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    loop = load()
    assert loop.main(["--mode", "async", "--crash-at-batch", "2", "--steps", "6"]) == 1
    out = capsys.readouterr().out
    assert "crashed at" in out and "fake env (2, 0) failed in step" in out
    assert "step  2" not in out  # the step of the crashed batch never trained


def test_main_runs_both_modes(capsys: pytest.CaptureFixture[str]) -> None:
    assert load().main(["--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "4 steps in 8.0 virtual seconds" in out and "4 steps in 5.0 virtual seconds" in out
