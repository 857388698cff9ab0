"""``rollout_error_tolerance=None`` resolves per model, as tinker-cookbook 0.6.1's ``effective_rollout_strategy``
(``rl/rollout_presets.py``, ``default_rollout_strategy_for_model``) does."""

from __future__ import annotations

from pathlib import Path

import pytest

from trio_rl import Config, FailFast, MinViableGroup, RetryOnFailure


def test_rollout_error_tolerance_defaults_to_none() -> None:
    assert Config(log_path="run").rollout_error_tolerance is None


@pytest.mark.parametrize(
    ("base_model", "expected"),
    [
        ("thinkingmachines/Inkling-1", MinViableGroup()),
        ("thinkingmachines/Inkling-1:peft:131072", MinViableGroup()),
        ("Qwen/Qwen3-8B", FailFast()),
        ("trio-rl-tiny", FailFast()),
        ("someone/thinkingmachines/Inkling", FailFast()),
    ],
)
def test_none_resolves_per_base_model(tmp_path: Path, base_model: str, expected: object) -> None:
    config = Config(log_path=tmp_path, base_model=base_model)
    config.validate()
    assert config.rollout_strategy() == expected


@pytest.mark.parametrize(("tolerance", "expected"), [(False, FailFast()), (True, RetryOnFailure())])
def test_an_explicit_tolerance_wins_over_the_model_default(tolerance: bool, expected: object) -> None:
    config = Config(log_path="run", base_model="thinkingmachines/Inkling-1", rollout_error_tolerance=tolerance)
    assert config.rollout_strategy() == expected


def test_the_command_lines_default_error_strategy_is_the_models() -> None:
    from trio_rl.cli import CommonArgs, make_config, parse_args

    config = make_config(parse_args(CommonArgs, ["--model", "thinkingmachines/Inkling-1"]))
    assert config.rollout_error_tolerance is None and config.rollout_strategy() == MinViableGroup()
    explicit = make_config(
        parse_args(CommonArgs, ["--model", "thinkingmachines/Inkling-1", "--error-strategy", "fail-fast"])
    )
    assert explicit.rollout_strategy() == FailFast()
