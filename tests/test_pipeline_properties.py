"""Property: any pipeline either finishes with every group accounted for, or raises the injected error.

With periodic evaluation and saving, and sometimes a cancel in the middle
followed by a resume: across the two runs, every group is trained exactly once
(or, under "requeue", dropped and counted), and no step is recorded twice.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import read_jsonl
from trio_rl import AsyncConfig, Config, StreamMinibatchConfig, train
from trio_rl.loop.determinism import derive_seed
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec, FakeEvaluator

VIRTUAL_DEADLINE_S = 100_000.0


class InjectedCrash(Exception):
    pass


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    mode = draw(st.sampled_from(["sync", "stream", "requeue", "pace", "oldest_first"]))
    batch_sizes = draw(st.lists(st.integers(1, 6), min_size=0, max_size=6))
    crash = None
    if batch_sizes and draw(st.booleans()):
        batch = draw(st.integers(0, len(batch_sizes) - 1))
        group = draw(st.integers(0, batch_sizes[batch] - 1))
        crash = (batch, group, draw(st.sampled_from(["make_envs", "step", "compute_group_rewards"])))
    first = batch_sizes[0] if batch_sizes else 1
    return {
        "mode": mode,
        "batch_sizes": batch_sizes,
        "group_size": draw(st.integers(1, 4)),
        "turns": draw(st.integers(1, 3)),
        "workers": draw(st.none() | st.integers(1, 9)),
        "k": draw(st.integers(0, 3)),
        "groups_per_batch": draw(st.integers(1, 7)),
        "num_minibatches": draw(st.sampled_from([d for d in range(1, first + 1) if first % d == 0])),
        "latencies": draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=3, max_size=3)),
        "step_latency": draw(st.sampled_from([0.0, 0.25, 2.0])),
        "crash": crash,
        "seed": draw(st.integers(0, 2**16)),
        "eval_every": draw(st.integers(0, 3)),
        "save_every": draw(st.integers(0, 3)),
        "eval_latency": draw(st.sampled_from([0.0, 0.5, 4.0])),
        "cancel_at": None if crash is not None else draw(st.none() | st.floats(0.0, 30.0)),
    }


def build(s: dict, log_path: Path) -> tuple[Config, FakeDataset, FakeBackend]:
    mode = s["mode"]
    extra: dict = {}
    if mode in ("requeue", "pace", "oldest_first"):
        extra["async_config"] = AsyncConfig(s["k"], s["groups_per_batch"], staleness=mode)
    elif mode == "stream":
        first = s["batch_sizes"][0] if s["batch_sizes"] else 1
        extra["stream_minibatch_config"] = StreamMinibatchConfig(first, s["num_minibatches"])
    config = Config(
        log_path=log_path,
        num_workers=s["workers"],
        seed=s["seed"],
        eval_every=s["eval_every"],
        save_every=s["save_every"],
        save_on_cancel=True,
        **extra,
    )
    fail_at = {} if s["crash"] is None else {s["crash"][:2]: s["crash"][2]}
    spec = FakeEnvSpec(
        group_size=s["group_size"], turns=s["turns"], step_latency=s["step_latency"], fail_at=fail_at, error=InjectedCrash
    )
    dataset = FakeDataset(spec=spec, batch_sizes=s["batch_sizes"])
    sample, train_latency, optim = s["latencies"]
    backend = FakeBackend(
        seed=s["seed"],
        sample_latency=lambda request: sample * (1 + derive_seed(request[2].seed) % 3),
        train_latency=train_latency,
        optim_latency=optim,
    )
    return config, dataset, backend


@settings(max_examples=int(os.environ.get("TRIO_RL_HYPOTHESIS_EXAMPLES", "120")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_run_finishes_accounted_for_or_raises_the_injected_error(s: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config, dataset, backend = build(s, Path(tmp) / "run")
        injected = bool(dataset.spec.fail_at)

        evaluators = (FakeEvaluator(latency=s["eval_latency"]),)

        async def main() -> None:
            with trio.fail_after(VIRTUAL_DEADLINE_S):
                async with backend:
                    if s["cancel_at"] is not None:
                        await cancel_then_resume(s["cancel_at"], config, dataset, backend, evaluators)
                        return
                    result = await train(config, dataset=dataset, backend=backend, evaluators=evaluators)
            assert not injected, "the injected crash was swallowed"
            summary = result.summary
            assert summary["run/trained_groups"] + summary["run/dropped_stale"] == dataset.total_groups
            assert summary["run/cancelled_groups"] == 0
            if s["mode"] != "requeue":
                assert summary["run/dropped_stale"] == 0
            made = sum(1 for line in dataset.log if line.startswith("make_envs"))
            cleaned = sum(1 for line in dataset.log if line.startswith("cleanup"))
            assert made == cleaned

        clock = trio.testing.MockClock(autojump_threshold=0)
        if injected:
            with pytest.RaisesGroup(InjectedCrash, flatten_subgroups=True):
                trio.run(main, clock=clock)
        else:
            trio.run(main, clock=clock)


async def cancel_then_resume(
    cancel_at: float, config: Config, dataset: FakeDataset, backend: FakeBackend, evaluators: tuple[FakeEvaluator, ...]
) -> None:
    with trio.move_on_after(cancel_at) as scope:
        await train(config, dataset=dataset, backend=backend, evaluators=evaluators)
    event(f"cancelled mid-run: {scope.cancelled_caught}")
    again = FakeDataset(spec=dataset.spec, batch_sizes=dataset.batch_sizes)
    resumed = await train(replace(config, resume=True), dataset=again, backend=backend, evaluators=evaluators)
    trained = [key for call in backend.calls_of("forward_backward") for key in call.detail["groups"]]
    assert len(trained) == len(set(trained)), "a group was trained twice across the cancel and the resume"
    everything = {(b, g) for b, size in enumerate(dataset.batch_sizes) for g in range(size)}
    if config.async_config is None or config.async_config.staleness != "requeue":
        assert set(trained) == everything, "a group was lost across the cancel and the resume"
    else:
        assert len(trained) + resumed.dropped_groups <= len(everything)
    steps = [r["step"] for r in read_jsonl(Path(config.log_path) / "metrics.jsonl") if "progress/groups" in r]
    assert steps == list(range(len(steps))), "a step was recorded twice or skipped"
