"""Invalid configuration is rejected before any work, naming the field and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trio.testing import MockClock

from tests.pipeline_helpers import run_fake
from trio_rl import (
    AsyncConfig,
    Config,
    ConfigError,
    FailFast,
    KLReferenceConfig,
    MinViableGroup,
    RetryOnFailure,
    StreamMinibatchConfig,
)
from trio_rl.testing import FakeBackend, FakeDataset


@pytest.mark.parametrize(
    ("kwargs", "field", "hint"),
    [
        ({"async_config": AsyncConfig(-1, 4)}, "async_config.max_steps_off_policy", "K must be >= 0"),
        ({"async_config": AsyncConfig(1, 0)}, "async_config.groups_per_batch", "at least 1"),
        ({"async_config": AsyncConfig(1, 4, staleness="drop")}, "async_config.staleness", "'oldest_first', 'pace' or 'requeue'"),  # type: ignore[arg-type]
        ({"async_config": AsyncConfig(1, 6), "num_substeps": 4}, "async_config.groups_per_batch", "multiple of 4"),
        ({"stream_minibatch_config": StreamMinibatchConfig(4, 3)}, "stream_minibatch_config.groups_per_batch", "multiple of 3"),
        ({"stream_minibatch_config": StreamMinibatchConfig(8, 2)}, "stream_minibatch_config.groups_per_batch", "make them equal"),
        ({"num_workers": 0}, "num_workers", "at least 1"),
        ({"learning_rate": 0.0}, "learning_rate", "positive"),
        ({"loss_fn": "mse"}, "loss_fn", "importance_sampling"),
        ({"kl_penalty_coef": 0.1}, "kl_reference_config", "must be given when kl_penalty_coef > 0"),
        ({"kl_penalty_coef": -0.1}, "kl_penalty_coef", "0 disables"),
        ({"max_steps": -1}, "max_steps", "None trains"),
        ({"eval_every": -1}, "eval_every", "0 disables"),
        ({"async_config": AsyncConfig(1, 4), "stream_minibatch_config": StreamMinibatchConfig(4, 1)}, "async_config", "exclusive"),
        ({"num_substeps": 3}, "dataset batch size", "multiple of 3"),
        ({"async_config": AsyncConfig(1, 4, "pace", inflight_weights=True)}, "async_config.inflight_weights", "staleness='oldest_first'"),
        ({"async_config": AsyncConfig(1, 4, "requeue", inflight_weights=True)}, "async_config.inflight_weights", "not 'requeue'"),
        ({"async_config": AsyncConfig(1, 4, inflight_weights=True), "num_substeps": 2}, "async_config.inflight_weights", "num_substeps=1"),
    ],
)
async def test_invalid_config_is_rejected_before_any_work(
    tmp_path: Path, kwargs: dict[str, Any], field: str, hint: str, autojump_clock: MockClock
) -> None:
    backend = FakeBackend()
    with pytest.raises(ConfigError, match=hint) as info:
        await run_fake(Config(log_path=tmp_path / "run", **kwargs), FakeDataset(3, 4), backend)
    assert info.value.field == field
    assert str(info.value).startswith(field)
    assert backend.calls == []
    assert not (tmp_path / "run").exists()


def test_rollout_error_tolerance_takes_the_cookbook_values(tmp_path: Path) -> None:
    assert Config(log_path=tmp_path).rollout_strategy() == FailFast()
    assert Config(log_path=tmp_path, rollout_error_tolerance=True).rollout_strategy() == RetryOnFailure(max_retries=3)
    strategy = MinViableGroup(max_retries=5)
    assert Config(log_path=tmp_path, rollout_error_tolerance=strategy).rollout_strategy() is strategy
    with pytest.raises(ConfigError, match="bool or an error strategy") as info:
        Config(log_path=tmp_path, rollout_error_tolerance="retry").validate()  # type: ignore[arg-type]
    assert info.value.field == "rollout_error_tolerance"


def test_the_default_async_policy_is_oldest_first_with_snapshot_weights() -> None:
    assert AsyncConfig(max_steps_off_policy=1, groups_per_batch=4).staleness == "oldest_first"
    assert AsyncConfig(max_steps_off_policy=1, groups_per_batch=4).inflight_weights is False


def test_default_mode_is_sync_and_async_config_selects_async(tmp_path: Path) -> None:
    assert Config(log_path=tmp_path).mode == "sync"
    assert Config(log_path=tmp_path, async_config=AsyncConfig(1, 2)).mode == "async"
    assert Config(log_path=tmp_path, stream_minibatch_config=StreamMinibatchConfig(2, 1)).mode == "stream"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", 0),
        ("lora_rank", 0),
        ("adam_beta1", 1.0),
        ("adam_beta2", -0.1),
        ("adam_eps", 0.0),
        ("weight_decay", -1.0),
        ("grad_clip_norm", float("nan")),
        ("eval_timeout", 0.0),
        ("cancel_save_timeout", -1.0),
        ("learning_rate", float("nan")),
    ],
)
def test_out_of_range_numbers_are_rejected_naming_the_field(tmp_path: Path, field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=f"^{field}: "):
        Config(log_path=tmp_path, **{field: value}).validate()  # type: ignore[arg-type]  # any numeric field, by name


def test_config_round_trips_through_config_json(tmp_path: Path) -> None:
    import json

    from trio_rl import MinViableGroup

    config = Config(
        log_path=tmp_path,
        loss_fn="ppo",
        loss_fn_config={"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
        async_config=AsyncConfig(2, 4, "pace", loss_fn="ppo"),
        rollout_error_tolerance=MinViableGroup(min_successful=2, max_retries=3),
        kl_penalty_coef=0.1,
        kl_reference_config=KLReferenceConfig("trio-rl-tiny"),
        max_steps=9,
    )
    (tmp_path / "config.json").write_text(json.dumps(config.to_json()))
    again = Config.from_json(json.loads((tmp_path / "config.json").read_text()))
    assert again == config and hash(again) == hash(config)
    again.validate()
    assert isinstance(again.async_config, AsyncConfig) and isinstance(again.rollout_error_tolerance, MinViableGroup)


def test_a_config_with_a_loss_fn_config_is_hashable() -> None:
    one = Config(log_path="a", loss_fn_config={"clip": 0.2})
    assert hash(one) == hash(Config(log_path="a", loss_fn_config={"clip": 0.2}))
    assert len({one, Config(log_path="a", loss_fn_config={"clip": 0.3})}) == 2


def test_from_json_names_an_unknown_field() -> None:
    with pytest.raises(ConfigError, match="bogus"):
        Config.from_json({"log_path": "a", "bogus": 1})
    with pytest.raises(ConfigError, match="async_config"):
        Config.from_json({"log_path": "a", "async_config": {"type": "Nope"}})
