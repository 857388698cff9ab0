"""Token-level staleness: ``async/token_lag_mean`` and ``_max``, exact where the backend says, a bound where not."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import trio
from tinker import types as tinker_types
from trio.testing import MockClock

from tests.conftest import read_metrics_by_step
from tests.pipeline_helpers import make_config, run_fake
from tests.work_items import finished_group, work_item
from trio_rl import AsyncConfig, TokensWithLogprobs, Trajectory, Transition
from trio_rl import _tinker_compat as compat
from trio_rl.loop.step_metrics import token_lag_metrics
from trio_rl.rl.data import trained_tokens_by_version
from trio_rl.testing import (
    FakeBackend,
    FakeDataset,
    FakeEnvSpec,
    FakeSamplerModel,
    FakeSamplingClient,
)
from trio_rl.types import PARSE_ERROR_MASKED_METRIC_KEY


def _transition(tokens: int, versions: list[int] | None, masked: bool = False) -> Transition:
    action = TokensWithLogprobs([7] * tokens, [-0.5] * tokens, token_versions=versions)
    metrics = {PARSE_ERROR_MASKED_METRIC_KEY: 1.0} if masked else {}
    return Transition(compat.model_input_from_ints([1, 2]), action, 0.0, True, metrics=metrics)


def test_only_unmasked_action_tokens_are_tallied_by_version() -> None:
    ob = compat.model_input_from_ints([1, 2])
    trajectories = [
        Trajectory([_transition(3, [4, 4, 5]), _transition(2, [5, 5], masked=True)], ob),
        Trajectory([_transition(0, []), _transition(4, [5, 6, 6, 6])], ob),
    ]
    assert trained_tokens_by_version(trajectories) == (7, ((4, 2), (5, 2), (6, 3)))


def test_one_trained_action_without_versions_makes_the_tally_unknown() -> None:
    ob = compat.model_input_from_ints([1, 2])
    trajectories = [Trajectory([_transition(3, [4, 4, 5])], ob), Trajectory([_transition(2, None)], ob)]
    assert trained_tokens_by_version(trajectories) == (5, None)
    # A masked action without versions trains nothing, so it does not matter.
    masked = [Trajectory([_transition(3, [4, 4, 5])], ob), Trajectory([_transition(2, None, masked=True)], ob)]
    assert trained_tokens_by_version(masked) == (3, ((4, 2), (5, 1)))


def test_token_lags_are_weighted_by_tokens_from_their_versions() -> None:
    # Step 10: 3 tokens of version 9 (lag 1), 1 of version 6 (lag 4); a group from version 8 without versions.
    groups = [
        finished_group(work_item(0), 6, trained_tokens=4, token_versions=((6, 1), (9, 3))),
        finished_group(work_item(0), 8, trained_tokens=4, token_versions=None),
    ]
    metrics = token_lag_metrics(10, groups)
    assert metrics == {"async/token_lag_mean": (3 * 1 + 1 * 4 + 4 * 2) / 8, "async/token_lag_max": 4}


def test_an_inflight_run_without_versions_records_the_bound_and_says_so() -> None:
    exact = token_lag_metrics(
        10, [finished_group(work_item(0), 6, trained_tokens=4, token_versions=((6, 1), (9, 3)))], inflight=True
    )
    assert "async/token_lag_is_bound" not in exact
    bound = token_lag_metrics(
        10,
        [
            finished_group(work_item(0), 6, trained_tokens=4, token_versions=((6, 1), (9, 3))),
            finished_group(work_item(0), 7, trained_tokens=2, token_versions=None),
        ],
        inflight=True,
    )
    assert bound["async/token_lag_is_bound"] == 1.0
    assert bound["async/token_lag_max"] == 4 and bound["async/token_lag_mean"] == (3 + 4 + 2 * 3) / 6
    assert token_lag_metrics(10, [finished_group(work_item(0), 7, trained_tokens=0, token_versions=None)]) == {}


def _longtail_backend(**kwargs: Any) -> FakeBackend:
    return FakeBackend(
        train_latency=0.2,
        **kwargs,
        sampler=FakeSamplerModel(
            slots=6,
            token_latency=0.01,
            response_length=lambda prompt, index: 3 + (prompt[1] * 37 + prompt[0] * 11 + index * 17) % 90,
        ),
    )


def _expected_lags(backend: FakeBackend) -> dict[int, list[int]]:
    """Each step's trained tokens' lags, from the fake sampler's per-token versions (one turn, nothing masked)."""
    by_group = defaultdict(list)
    for sequence in backend.sequences:
        by_group[(sequence.prompt[0] - 1, sequence.prompt[1] - 2)].append(sequence)
    lags: dict[int, list[int]] = defaultdict(list)
    for call in backend.calls_of("forward_backward"):
        for key in call.detail["groups"]:
            for sequence in by_group[tuple(key)]:
                versions = sequence.token_versions or (sequence.version,) * sequence.length
                lags[call.version].extend(call.version - v for v in versions)
    return lags


@pytest.mark.parametrize("inflight", [False, True])
async def test_each_step_records_the_lag_of_the_tokens_it_trained(
    log_path: Path, inflight: bool, autojump_clock: MockClock
) -> None:
    backend = _longtail_backend()
    config = make_config(
        log_path,
        "oldest_first",
        max_tokens=200,
        async_config=AsyncConfig(2, 4, inflight_weights=inflight, loss_fn="importance_sampling"),
    )
    await run_fake(config, FakeDataset(8, 4, FakeEnvSpec(group_size=3)), backend)
    records = [r for r in read_metrics_by_step(log_path / "metrics.jsonl") if "async/token_lag_mean" in r]
    expected = _expected_lags(backend)
    assert [r["step"] for r in records] == sorted(expected)
    for record in records:
        lags = expected[record["step"]]
        assert record["async/token_lag_mean"] == pytest.approx(sum(lags) / len(lags))
        assert record["async/token_lag_max"] == max(lags)
        assert "async/token_lag_is_bound" not in record
        if not inflight:
            # Snapshot weights: every token of a group has its group's staleness.
            assert record["async/token_lag_max"] == record["async/staleness_max"]
    spans = sum(1 for s in backend.sequences if s.token_versions is not None and len(set(s.token_versions)) > 1)
    assert (spans > 0) == inflight
    if inflight:
        # In flight, later tokens come from newer weights than their group started on.
        assert any(r["async/token_lag_mean"] < r["async/staleness_mean"] for r in records)


class _SilentInflightClient(FakeSamplingClient):
    """An in-flight client that, like Tinker's, does not say which weights produced each token."""

    async def sample(
        self, prompt: tinker_types.ModelInput, num_samples: int, sampling_params: tinker_types.SamplingParams
    ) -> tinker_types.SampleResponse:
        response = await super().sample(prompt, num_samples, sampling_params)
        plain = [compat.sampled_sequence(s.tokens, s.logprobs, s.stop_reason) for s in response.sequences]
        return compat.sample_response(plain)


async def test_an_inflight_run_on_a_backend_that_does_not_say_records_the_group_bound(
    log_path: Path, autojump_clock: MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trio_rl.testing.clients as fake_clients

    # The training client builds its sampling clients by this module's name.
    monkeypatch.setattr(fake_clients, "FakeSamplingClient", _SilentInflightClient)
    config = make_config(
        log_path, "oldest_first", async_config=AsyncConfig(2, 4, inflight_weights=True, loss_fn="importance_sampling")
    )
    with trio.fail_after(1_000):
        await run_fake(config, FakeDataset(6, 4, FakeEnvSpec(group_size=3)), _longtail_backend())
    records = [r for r in read_metrics_by_step(log_path / "metrics.jsonl") if "async/token_lag_mean" in r]
    assert records
    for record in records:
        assert record["async/token_lag_is_bound"] == 1.0
        assert record["async/token_lag_max"] == record["async/staleness_max"]
