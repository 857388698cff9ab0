"""Every field of tinker-cookbook 0.6.1's Config, AsyncConfig, StreamMinibatchConfig, KLReferenceConfig.

The walk reads the fields from ``chz.chz_fields``, so a field the cookbook adds
fails here until trio_rl.cookbook.fields says what it does with it. A refused
value fails before the dataset is built and before any backend call.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, NoReturn

import chz
import pytest
from tinker_cookbook.rl import train as cookbook
from tinker_cookbook.rl.rollout_limits import TerminationRewardPolicy
from tinker_cookbook.rl.rollout_strategy import FailFast as CookbookFailFast
from tinker_cookbook.rl.rollout_strategy import MinViableGroup as CookbookMinViableGroup
from tinker_cookbook.rl.rollout_strategy import RetryOnFailure as CookbookRetryOnFailure

import trio_rl
from trio_rl import ConfigError
from trio_rl.backends.protocol import SamplingClient, TrainingClient
from trio_rl.cookbook import fields
from trio_rl.cookbook import train as drop_in


class RecordingBuilder:
    """A dataset builder that records being called (a refused field must fail before it)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> tuple[Any, Any]:
        self.calls += 1
        raise AssertionError("the dataset was built for a configuration that should have been refused")


class UntouchableBackend:
    """A backend that records any use."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def __aenter__(self) -> UntouchableBackend:
        self.calls.append("enter")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.calls.append("exit")

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> TrainingClient:
        return self._refuse("create_training_client")

    async def create_training_client_from_state(self, path: str, *, with_optimizer: bool = True) -> TrainingClient:
        return self._refuse("create_training_client_from_state")

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> SamplingClient:
        return self._refuse("create_sampling_client")

    def _refuse(self, call: str) -> NoReturn:
        self.calls.append(call)
        raise AssertionError("a backend call for a configuration that should have been refused")


def cookbook_config(tmp_path: Path, **overrides: Any) -> Any:
    values: dict[str, Any] = {
        "learning_rate": 1e-4,
        "dataset_builder": RecordingBuilder(),
        "model_name": "some/model",
        "recipe_name": "recipe_test",
        "max_tokens": 8,
        "log_path": str(tmp_path / "run"),
        **overrides,
    }
    return cookbook.Config(**values)


def test_every_config_field_is_named_exactly_once() -> None:
    named = fields.config_fields()
    assert len(named) == len(set(named))
    assert set(named) == set(chz.chz_fields(cookbook.Config))
    assert len(chz.chz_fields(cookbook.Config)) == 38


def test_every_nested_config_field_is_read() -> None:
    assert set(fields.ASYNC_FIELDS) == set(chz.chz_fields(cookbook.AsyncConfig))
    assert set(chz.chz_fields(drop_in.AsyncConfig)) == {*fields.ASYNC_FIELDS, "sampling_steps_ahead"}
    assert set(fields.STREAM_FIELDS) == set(chz.chz_fields(cookbook.StreamMinibatchConfig))
    assert set(fields.KL_REFERENCE_FIELDS) == set(chz.chz_fields(cookbook.KLReferenceConfig))
    assert drop_in.StreamMinibatchConfig is cookbook.StreamMinibatchConfig
    assert drop_in.KLReferenceConfig is cookbook.KLReferenceConfig
    assert drop_in.Config is cookbook.Config


NON_DEFAULT = {
    "learning_rate": 3e-3,
    "max_tokens": 17,
    "eval_every": 3,
    "save_every": 4,
    "kl_penalty_coef": 0.5,
    "kl_discount_factor": 0.25,
    "loss_fn": "ppo",
    "num_substeps": 2,
    "lora_rank": 8,
    "temperature": 0.7,
    "remove_constant_reward_groups": True,
    "max_steps": 9,
    "compute_post_kl": True,
    "num_epochs": 2,
    "rolling_save_every": 3,
}


@pytest.mark.parametrize("name", fields.SAME_NAME)
def test_a_same_name_field_reaches_trio_rl_config(tmp_path: Path, name: str) -> None:
    extra = {"kl_reference_config": cookbook.KLReferenceConfig(base_model="ref")} if name.startswith("kl_") else {}
    config = cookbook_config(tmp_path, **{name: NON_DEFAULT[name]}, **extra)
    assert getattr(fields.native_config(config, resume=False), name) == NON_DEFAULT[name]
    assert getattr(cookbook_config(tmp_path), name) != NON_DEFAULT[name], "the value chosen is the default"


def test_converted_fields_reach_trio_rl_config(tmp_path: Path) -> None:
    config = cookbook_config(
        tmp_path,
        model_name="base/m",
        load_checkpoint_path="ckpt/1",
        loss_fn_config={"clip_low_threshold": 0.8},
        kl_penalty_coef=0.1,
        kl_reference_config=cookbook.KLReferenceConfig(base_model="ref", load_checkpoint_path="ref/1"),
        rollout_error_tolerance=CookbookRetryOnFailure(max_retries=5, per_rollout_timeout=0),
        async_config=drop_in.AsyncConfig(groups_per_batch=3, max_steps_off_policy=2, loss_fn="ppo"),
    )
    native = fields.native_config(config, resume=False)
    assert native.base_model == "base/m" and native.log_path == tmp_path / "run"
    assert native.load_checkpoint_path == "ckpt/1" and not native.resume
    assert native.loss_fn_config == {"clip_low_threshold": 0.8}
    assert native.kl_reference_config == trio_rl.KLReferenceConfig(base_model="ref", load_checkpoint_path="ref/1")
    # 0.6.1's per_rollout_timeout=0 means no timeout, trio_rl's None.
    assert native.rollout_error_tolerance == trio_rl.RetryOnFailure(max_retries=5, per_rollout_timeout=None)
    assert native.async_config == trio_rl.AsyncConfig(
        max_steps_off_policy=2, groups_per_batch=3, staleness="oldest_first", loss_fn="ppo"
    )
    stream = fields.native_config(
        cookbook_config(
            tmp_path, stream_minibatch_config=cookbook.StreamMinibatchConfig(groups_per_batch=4, num_minibatches=2)
        ),
        resume=False,
    )
    assert stream.stream_minibatch_config == trio_rl.StreamMinibatchConfig(groups_per_batch=4, num_minibatches=2)


@pytest.mark.parametrize(
    ("tolerance", "expected"),
    [
        (None, None),
        (False, False),
        (True, True),
        (CookbookFailFast(), trio_rl.FailFast()),
        (
            CookbookMinViableGroup(min_successful=2, max_retries=1, per_rollout_timeout=5.0),
            trio_rl.MinViableGroup(min_successful=2, max_retries=1, per_rollout_timeout=5.0),
        ),
    ],
)
def test_rollout_error_tolerance(tmp_path: Path, tolerance: Any, expected: Any) -> None:
    config = cookbook_config(tmp_path, rollout_error_tolerance=tolerance)
    assert fields.native_config(config, resume=False).rollout_error_tolerance == expected


def test_a_resume_wins_over_load_checkpoint_path_as_in_0_6_1(tmp_path: Path) -> None:
    native = fields.native_config(cookbook_config(tmp_path, load_checkpoint_path="ckpt/1"), resume=True)
    assert native.resume and native.load_checkpoint_path is None


def test_labels_change_nothing_trained(tmp_path: Path) -> None:
    labelled = cookbook_config(
        tmp_path, recipe_name="other", renderer_name="role_colon", session_name="s", wandb_name="w"
    )
    assert fields.native_config(labelled, resume=False) == fields.native_config(cookbook_config(tmp_path), resume=False)


def test_the_logging_fields_map_onto_transcripts_trace_and_timeline(tmp_path: Path) -> None:
    config = cookbook_config(tmp_path, num_groups_to_log=2, enable_trace=True, span_chart_every=3)
    native = fields.native_config(config, resume=False)
    assert (native.transcripts_every, native.transcript_groups) == (1, 2)
    assert native.trace is True and native.timeline_every == 3
    quiet = fields.native_config(cookbook_config(tmp_path, num_groups_to_log=0), resume=False)
    assert (quiet.transcripts_every, quiet.trace, quiet.timeline_every) == (0, False, 0)


REFUSED = {
    "wandb_project": "project",
    "ttl_seconds": 60,
    "rolling_ttl_seconds": 60,
}


def refused_fields() -> list[str]:
    return [name for name, rule in fields.ONLY_AT.items() if rule.reason != "never refused"]


def test_the_refused_values_cover_every_field_accepted_only_at_some_values() -> None:
    assert set(refused_fields()) == set(REFUSED)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_refused_value_fails_in_one_line_before_any_work(tmp_path: Path, name: str) -> None:
    builder = RecordingBuilder()
    backend = UntouchableBackend()
    config = cookbook_config(tmp_path, dataset_builder=builder, **{name: REFUSED[name]})
    with pytest.raises(ConfigError) as caught:
        asyncio.run(drop_in.main(config, backend=backend))
    assert caught.value.field == name and "\n" not in str(caught.value)
    assert builder.calls == 0 and backend.calls == []
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"base_url": "http://localhost:1"}, "base_url"),
        ({"loss_fn": "no_such_loss"}, "loss_fn"),
        ({"kl_penalty_coef": 0.5}, "kl_reference_config"),
        (
            {"async_config": drop_in.AsyncConfig(groups_per_batch=2, max_steps_off_policy=1), "loss_fn": "ppo"},
            "loss_fn",
        ),
    ],
)
def test_an_unsupported_combination_fails_before_any_work(
    tmp_path: Path, overrides: dict[str, Any], field: str
) -> None:
    builder = RecordingBuilder()
    backend = UntouchableBackend()
    with pytest.raises(ConfigError) as caught:
        asyncio.run(drop_in.main(cookbook_config(tmp_path, dataset_builder=builder, **overrides), backend=backend))
    assert caught.value.field == field and "\n" not in str(caught.value)
    assert builder.calls == 0 and backend.calls == []


def test_a_rollout_executor_is_refused(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as executor, pytest.raises(ConfigError, match="rollout_executor"):
        asyncio.run(drop_in.main(cookbook_config(tmp_path), executor, backend=UntouchableBackend()))


def test_sampling_steps_ahead_is_max_steps_off_policy(tmp_path: Path) -> None:
    new_name = drop_in.AsyncConfig(groups_per_batch=2, sampling_steps_ahead=3)
    both = drop_in.AsyncConfig(groups_per_batch=2, sampling_steps_ahead=3, max_steps_off_policy=3)
    for value in (new_name, both):
        native = fields.native_config(cookbook_config(tmp_path, async_config=value), resume=False)
        assert native.async_config is not None and native.async_config.max_steps_off_policy == 3
    with pytest.raises(ConfigError, match=r"async_config\.sampling_steps_ahead: 3 differs from max_steps_off_policy=2"):
        drop_in.AsyncConfig(groups_per_batch=2, sampling_steps_ahead=3, max_steps_off_policy=2)
    with pytest.raises(ConfigError, match="async_config"):
        drop_in.AsyncConfig(groups_per_batch=0, max_steps_off_policy=1)


def test_termination_is_converted_and_none_resolves_per_model_as_0_6_1(tmp_path: Path) -> None:
    explicit = TerminationRewardPolicy(zero_reward_on_limit=True, grader_timeout_seconds=3.0)
    native = fields.native_config(cookbook_config(tmp_path, termination=explicit), resume=False)
    assert native.termination == trio_rl.TerminationRewardPolicy(zero_reward_on_limit=True, grader_timeout_seconds=3.0)
    assert fields.native_config(cookbook_config(tmp_path), resume=False).termination is None
    # 0.6.1's Config.effective_termination(): the agentic preset for Inkling models.
    inkling = cookbook_config(tmp_path, model_name="thinkingmachines/Inkling-1")
    assert inkling.effective_termination() is not None
    native = fields.native_config(inkling, resume=False)
    assert native.termination == fields.termination_policy(inkling.effective_termination())
    assert native.termination is not None and native.termination.zero_reward_on_limit
