"""The KL penalty against a reference model, checked against hand-computed values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import trio
from tinker import types as tinker_types
from trio.testing import MockClock

from tests.pipeline_helpers import make_config, run_fake
from trio_rl import KLReferenceConfig
from trio_rl import _tinker_compat as compat
from trio_rl.backends.local import LocalBackend, ModelConfig
from trio_rl.rl.kl import discounted_future_sum, incorporate_kl_penalty, reference_logprob_diffs
from trio_rl.testing import FakeBackend, FakeDataset

TINY = ModelConfig(d_model=16, n_layers=1, n_heads=2, max_seq_len=32)


def datum(tokens: list[int], logprobs: list[float], advantages: list[float], mask: list[float]) -> tinker_types.Datum:
    return tinker_types.Datum(
        model_input=compat.model_input_from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": compat.tensor(tokens[1:], "int64"),
            "logprobs": compat.tensor(logprobs, "float32"),
            "advantages": compat.tensor(advantages, "float32"),
            "mask": compat.tensor(mask, "float32"),
        },
    )


def advantages(d: tinker_types.Datum) -> list[float]:
    return d.loss_fn_inputs["advantages"].tolist()


def test_the_penalty_enters_the_advantages_as_the_cookbook_adds_it() -> None:
    a = datum([1, 2, 3], [0.0, -1.0], [0.0, 0.5], [0.0, 1.0])
    b = datum([1, 4, 5, 6], [0.0, -2.0, -1.0], [0.0, -0.5, -0.5], [0.0, 1.0, 1.0])
    # (sampled - reference) * mask, per target token; action diffs 0.3, 0.6, -0.3.
    diffs = [np.array([0.0, 0.3]), np.array([0.0, 0.6, -0.3])]
    penalty = incorporate_kl_penalty([a, b], diffs, coef=0.5, discount=0.0)
    avg = (0.3 + 0.6 - 0.3) / 3  # 0.2
    assert penalty.diff_sum == pytest.approx(0.6) and penalty.tokens == 3
    assert advantages(penalty.data[0]) == pytest.approx([0.0, 0.5 + 0.5 * (avg - 0.3)])
    assert advantages(penalty.data[1]) == pytest.approx([0.0, -0.5 + 0.5 * (avg - 0.6), -0.5 + 0.5 * (avg + 0.3)])
    # Discounted: each token's penalty plus gamma times the ones after it.
    discounted = incorporate_kl_penalty([b], [diffs[1]], coef=1.0, discount=0.5)
    avg_b = 0.15
    t1, t2 = avg_b - 0.6, avg_b + 0.3
    assert advantages(discounted.data[0]) == pytest.approx([0.5 * t1 + 0.25 * t2, -0.5 + t1 + 0.5 * t2, -0.5 + t2])
    assert discounted_future_sum(np.array([1.0, 2.0, 3.0]), 0.5).tolist() == [1.0 + 1.0 + 0.75, 2.0 + 1.5, 3.0]


async def test_local_reference_is_the_initial_weights_and_diffs_match_its_logprobs(tmp_path: Path) -> None:
    async with LocalBackend(log_dir=tmp_path, model_config=TINY, seed=0) as backend:
        trainer = await backend.create_training_client(base_model="tiny", seed=7)
        initial = await trainer.save_weights_for_sampler("initial")
        reference = await backend.create_sampling_client(base_model="tiny")
        sequence = compat.model_input_from_ints([3, 5, 8, 13])
        assert await reference.compute_logprobs(sequence) == await initial.compute_logprobs(sequence)
        d = datum([3, 5, 8, 13], [0.0, -1.25, -2.5], [0.0, 1.0, 1.0], [0.0, 1.0, 1.0])
        (diff,) = await reference_logprob_diffs(reference, [d])
        scored = await initial.compute_logprobs(sequence)
        assert scored[2] is not None and scored[3] is not None
        assert diff.tolist() == pytest.approx([0.0, -1.25 - scored[2], -2.5 - scored[3]])
        with pytest.raises(ValueError, match="no initial weights for 'other'"):
            await backend.create_sampling_client(base_model="other")


async def test_a_run_with_a_kl_penalty_scores_against_the_reference_and_records_it(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    config = make_config(log_path, "sync", kl_penalty_coef=0.1, kl_reference_config=KLReferenceConfig("trio-rl-tiny"))
    with trio.fail_after(1000):
        result = await run_fake(config, FakeDataset(2, 2), backend)
    (created,) = backend.calls_of("create_sampling_client")
    assert created.detail == {"base_model": "trio-rl-tiny", "model_path": None}
    # One reference scoring per Datum: 2 steps x 2 groups x 4 envs, single-turn.
    assert len(backend.calls_of("compute_logprobs")) == 16
    assert all("kl_policy_base" in m for m in result.step_metrics)
