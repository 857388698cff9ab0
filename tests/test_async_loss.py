"""The README's default async configuration, unchanged, trains on FakeBackend and LocalBackend (HFBackend:
``test_hf_async_default.py``).

``AsyncConfig.loss_fn=None`` resolves per backend (:mod:`trio_rl.async_loss`): the
cookbook's ``stable_reinforce`` on the fake (and Tinker), truncated importance
sampling on the in-process backends, which lack ``stable_reinforce``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import trio_rl
from trio_rl.backends.local import LocalBackend
from trio_rl.testing import FakeBackend, FakeDataset


def readme_config(log_path: Path, **model: Any) -> trio_rl.Config:
    """The README's "A run in code" configuration (a model to load where the backend needs one)."""
    return trio_rl.Config(
        log_path=log_path,
        async_config=trio_rl.AsyncConfig(max_steps_off_policy=1, groups_per_batch=4),
        **model,
    )


def _trained_loss(log_path: Path) -> tuple[str, Any]:
    saved = json.loads((log_path / "config.json").read_text())
    return saved["async_config"]["loss_fn"], saved["loss_fn_config"]


def test_the_readme_default_trains_on_the_fake_backend(tmp_path: Path) -> None:
    backend = FakeBackend()
    result = trio_rl.run(
        readme_config(tmp_path / "run"), dataset=FakeDataset(num_batches=5, batch_size=4), backend=backend
    )
    assert result.summary["run/trained_groups"] == 20
    assert {c.detail["loss_fn"] for c in backend.calls_of("forward_backward")} == {"stable_reinforce"}
    assert _trained_loss(tmp_path / "run") == ("stable_reinforce", None)


def assert_trained_with_tis(result: trio_rl.TrainResult, log_path: Path) -> None:
    assert result.final_step == 5 and result.summary["run/trained_groups"] == 20
    assert _trained_loss(log_path) == ("importance_sampling", {"tis_cap": 2.0})
    steps = result.step_metrics
    # Every step's weights statistics: the backend computed the corrected loss on real logprobs.
    assert all(m["offpolicy/tokens"] > 0 and 0 < m["offpolicy/ess"] <= 1 for m in steps)
    assert all(m["offpolicy/is_weight_max"] > 0 for m in steps)


def test_the_readme_default_trains_on_local_backend(tmp_path: Path) -> None:
    backend = LocalBackend(log_dir=tmp_path / "backend", seed=0)
    result = trio_rl.run(
        readme_config(tmp_path / "run"), dataset=FakeDataset(num_batches=5, batch_size=4), backend=backend
    )
    assert_trained_with_tis(result, tmp_path / "run")


async def test_an_explicit_loss_the_backend_cannot_train_still_fails_before_any_work(tmp_path: Path) -> None:
    config = trio_rl.Config(
        log_path=tmp_path / "run", async_config=trio_rl.AsyncConfig(1, 4, loss_fn="stable_reinforce")
    )
    async with LocalBackend(log_dir=tmp_path / "backend") as backend:
        with pytest.raises(trio_rl.ConfigError, match="LocalBackend does not implement loss_fn='stable_reinforce'"):
            await trio_rl.train(config, dataset=FakeDataset(1, 4), backend=backend)
    assert not (tmp_path / "run").exists()


async def test_a_bad_correction_in_the_default_loss_fails_before_any_work(tmp_path: Path) -> None:
    config = trio_rl.Config(
        log_path=tmp_path / "run", loss_fn_config={"tis_cap": -1.0}, async_config=trio_rl.AsyncConfig(1, 4)
    )
    async with LocalBackend(log_dir=tmp_path / "backend") as backend:
        with pytest.raises(trio_rl.ConfigError, match="tis_cap must be > 0") as info:
            await trio_rl.train(config, dataset=FakeDataset(1, 4), backend=backend)
    assert info.value.field == "async_config.loss_fn"
    assert not (tmp_path / "run").exists()


def test_the_command_lines_backend_wrapper_resolves_as_the_backend_it_wraps(tmp_path: Path) -> None:
    from trio_rl.async_loss import backend_async_loss
    from trio_rl.cli.backend import LazyTokenizer, _BindTokenizer

    local = _BindTokenizer(LocalBackend(log_dir=tmp_path / "backend"), LazyTokenizer())
    assert backend_async_loss(local) == ("importance_sampling", {"tis_cap": 2.0})
    assert backend_async_loss(_BindTokenizer(FakeBackend(), LazyTokenizer())) == ("stable_reinforce", None)
