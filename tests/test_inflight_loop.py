"""An in-flight run in virtual time: bit-identical files run to run, exactly-once training across a resume,
and a cancel during an in-flight publish that leaves the saved state and its record in agreement."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from tinker import types as tinker_types
from trio.testing import MockClock

from tests.conftest import TaskOrder, read_jsonl
from tests.pipeline_helpers import make_config, run_fake
from trio_rl import AsyncConfig, Config
from trio_rl import _tinker_compat as compat
from trio_rl.backends.protocol import token_versions
from trio_rl.base.determinism import derive_seed
from trio_rl.loop.checkpoints import CheckpointLog
from trio_rl.rl.metrics import WALL_TIME_PREFIX
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec, FakeEvaluator, FakeLatencies, FakeSamplerModel

GROUPS = 6 * 4
"""Groups in the datasets below: 6 batches of 4."""


def inflight_config(log_path: Path, k: int = 2, **overrides: Any) -> Config:
    async_config = AsyncConfig(k, 4, inflight_weights=True, loss_fn="importance_sampling")
    return make_config(log_path, "oldest_first", async_config=async_config, **overrides)


def sampler_model(seed: int = 0, latencies: FakeLatencies | None = None) -> FakeBackend:
    """Few distinct lengths, so that sequences end, and weights are published, at the same instants."""

    def length(prompt: Sequence[int], index: int) -> int:
        return (2, 4, 4, 8, 30)[derive_seed(seed, *prompt[:3], index) % 5]

    sampler = FakeSamplerModel(slots=5, token_latency=0.125, response_length=length)
    return FakeBackend(seed=seed, train_latency=0.75, latencies=latencies, sampler=sampler)


def trained_keys(backend: FakeBackend) -> list[tuple[int, int]]:
    return [tuple(key) for call in backend.calls_of("forward_backward") for key in call.detail["groups"]]


def run_once(
    task_order: TaskOrder, log_path: Path, seed: int, scheduling_seed: int
) -> tuple[list[dict[str, Any]], str]:
    async def main() -> None:
        dataset = FakeDataset(6, 4, FakeEnvSpec(group_size=3, turns=2))
        config = inflight_config(log_path, seed=seed, eval_every=2, save_every=2, max_tokens=32)
        await run_fake(config, dataset, sampler_model(seed), evaluators=(FakeEvaluator(latency=0.3),))

    with task_order(scheduling_seed):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    records = [
        {k: v for k, v in r.items() if not k.startswith(WALL_TIME_PREFIX)}
        for r in read_jsonl(log_path / "metrics.jsonl")
    ]
    return records, (log_path / "checkpoints.jsonl").read_text()


def test_an_inflight_run_writes_identical_files_whatever_the_task_order(
    tmp_path: Path, trio_task_order_from_seed: TaskOrder
) -> None:
    first = run_once(trio_task_order_from_seed, tmp_path / "a", seed=7, scheduling_seed=1)
    second = run_once(trio_task_order_from_seed, tmp_path / "b", seed=7, scheduling_seed=2)
    assert first == second
    records = [r for r in first[0] if "async/token_lag_mean" in r]
    # Not vacuous: sequences spanned publishes, so tokens are fresher than their groups...
    assert any(r["async/token_lag_mean"] < r["async/staleness_mean"] for r in records)
    # ... and another seed samples other lengths, hence other lags.
    assert run_once(trio_task_order_from_seed, tmp_path / "c", seed=8, scheduling_seed=1)[0] != first[0]


@pytest.mark.parametrize("cancel_at", [2.3, 4.1, 6.7, 9.2])
async def test_a_cancel_and_resume_of_an_inflight_run_trains_every_group_exactly_once(
    log_path: Path, cancel_at: float, autojump_clock: MockClock
) -> None:
    backend = sampler_model()
    config = inflight_config(log_path, save_on_cancel=True, max_tokens=32)
    with trio.move_on_after(cancel_at) as scope:
        await run_fake(config, FakeDataset(6, 4, FakeEnvSpec(group_size=3)), backend)
    assert scope.cancelled_caught
    checkpoint = CheckpointLog(log_path).last()
    assert checkpoint is not None and checkpoint.reason == "cancelled"
    assert backend.states[checkpoint.state_path] == checkpoint.step
    before = len(trained_keys(backend))

    resumed = await run_fake(
        inflight_config(log_path, resume=True, max_tokens=32), FakeDataset(6, 4, FakeEnvSpec(group_size=3)), backend
    )
    trained = trained_keys(backend)
    assert 0 < before < len(trained)
    assert sorted(trained) == sorted({(b, g) for b in range(6) for g in range(4)})
    assert resumed.trained_groups == GROUPS and resumed.dropped_groups == 0
    # The resumed run published in flight too, and its tokens carry versions from its own weights on.
    assert all(c.detail["inflight"] for c in backend.calls_of("save_weights_for_sampler"))
    resumed_sequences = [s for s in backend.sequences if s.requested >= cancel_at]
    assert resumed_sequences and all(
        s.token_versions is not None and min(s.token_versions) >= checkpoint.step for s in resumed_sequences
    )


async def test_a_cancel_during_an_inflight_publish_saves_a_state_its_record_describes(
    log_path: Path, autojump_clock: MockClock
) -> None:
    # forward_backward takes 0.75 s and each publish 5 s; the state saves in 0.25 s.
    backend = sampler_model(latencies=FakeLatencies(save=5.0, state=0.25))
    config = inflight_config(log_path, save_on_cancel=True, max_tokens=32)
    with trio.move_on_after(12.0) as scope:
        await run_fake(config, FakeDataset(6, 4, FakeEnvSpec(group_size=3)), backend)
    assert scope.cancelled_caught
    saves = backend.calls_of("save_weights_for_sampler")
    # The cancel came while the last publish was still being saved.
    assert saves[-1].time < 12.0 < saves[-1].time + 5.0
    checkpoint = CheckpointLog(log_path).last()
    assert checkpoint is not None and checkpoint.reason == "cancelled"
    # The state holds every optimizer step taken, the one whose publish was cut included, and the row says so.
    steps_taken = len(backend.calls_of("optim_step"))
    assert backend.states[checkpoint.state_path] == checkpoint.step == steps_taken
    records = read_jsonl(log_path / "metrics.jsonl")
    assert max(r["step"] for r in records if "progress/trained_groups" in r) == checkpoint.step - 1
    # That step's weights were never published, so the row names no sampler for them.
    assert checkpoint.sampler_path is None or backend.samplers[checkpoint.sampler_path] == checkpoint.step

    resumed = await run_fake(
        inflight_config(log_path, resume=True, max_tokens=32), FakeDataset(6, 4, FakeEnvSpec(group_size=3)), backend
    )
    trained = trained_keys(backend)
    assert len(trained) == len(set(trained)) == GROUPS
    assert resumed.trained_groups == GROUPS


class SamplingEvaluatorFake:
    """Samples a long answer after a delay, so later steps publish while it samples; records what it saw."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, bool, list[int] | None]] = []

    async def __call__(self, sampling_client: Any) -> dict[str, float]:
        client = sampling_client
        await trio.sleep(0.5)
        response = await client.sample(
            compat.model_input_from_ints([1, 2, 3]), 1, tinker_types.SamplingParams(max_tokens=30, seed=0)
        )
        versions = token_versions(response.sequences[0])
        self.seen.append((client.version, getattr(client, "inflight", False), versions))
        return {"test/version": float(client.version)}


async def test_an_inflight_run_evaluates_each_step_on_exactly_its_weights(
    log_path: Path, autojump_clock: MockClock
) -> None:
    evaluator = SamplingEvaluatorFake()
    backend = sampler_model(0)
    config = inflight_config(log_path, eval_every=1, max_tokens=32)
    with trio.fail_after(600):
        await run_fake(config, FakeDataset(6, 4, FakeEnvSpec(group_size=3)), backend, evaluators=(evaluator,))
    steps = [r["step"] for r in read_jsonl(log_path / "metrics.jsonl") if "test/version" in r]
    assert steps == list(range(7))
    # Each evaluation sampled on a client pinned to its step's weights, though later steps were published
    # while it sampled (an in-flight client would have produced some tokens from those).
    assert [version for version, _, _ in evaluator.seen] == steps
    assert all(not inflight and versions is None for _, inflight, versions in evaluator.seen)
    inflight_publishes = [c for c in backend.calls_of("save_weights_for_sampler") if c.detail["inflight"]]
    assert len(inflight_publishes) == 7


class PredatesInflightTrainingClient:
    """A user's training-client wrapper written before in-flight weights: ``save_weights_for_sampler(name)`` only."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def save_weights_for_sampler(self, name: str) -> Any:
        return await self.inner.save_weights_for_sampler(name)


class PredatesInflightBackendFake(FakeBackend):
    async def create_training_client(self, **kwargs: Any) -> Any:
        return PredatesInflightTrainingClient(await super().create_training_client(**kwargs))


@pytest.mark.parametrize("async_mode", [False, True])
async def test_a_training_client_without_the_inflight_argument_still_runs_snapshot_runs(
    log_path: Path, async_mode: bool, autojump_clock: MockClock
) -> None:
    async_config = AsyncConfig(1, 4, loss_fn="importance_sampling") if async_mode else None
    config = make_config(log_path, "oldest_first" if async_mode else "sync", async_config=async_config)
    backend = PredatesInflightBackendFake()
    with trio.fail_after(600):
        result = await run_fake(config, FakeDataset(3, 4), backend)
    assert result.trained_groups == 12
    assert [c.detail["inflight"] for c in backend.calls_of("save_weights_for_sampler")] == [False] * 4
