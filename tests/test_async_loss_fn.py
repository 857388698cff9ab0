"""AsyncConfig.loss_fn, as in tinker-cookbook 0.6.1 (``rl/train.py``: ``AsyncConfig``, ``Config.training_loss_fn``
and the conflict check at the top of ``main``), its default resolved per backend, and which backends train it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tinker import types as tinker_types
from trio.testing import MockClock

from tests.pipeline_helpers import MODES, make_config, run_fake
from trio_rl import AsyncConfig, Config, ConfigError, train
from trio_rl import _tinker_compat as compat
from trio_rl.async_loss import with_async_loss
from trio_rl.backends.local import LocalBackend
from trio_rl.testing import FakeBackend, FakeDataset


def test_async_config_loss_defaults_to_none_resolved_per_backend() -> None:
    assert AsyncConfig(1, 4).loss_fn is None


@pytest.mark.parametrize("mode", list(MODES))
def test_the_training_loss_is_async_configs_in_async_mode_and_config_loss_otherwise(tmp_path: Path, mode: str) -> None:
    is_async = make_config(tmp_path, mode).async_config is not None
    on_fake = with_async_loss(make_config(tmp_path, mode), FakeBackend())
    assert on_fake.training_loss_fn() == ("stable_reinforce" if is_async else "importance_sampling")
    on_fake_ppo = with_async_loss(make_config(tmp_path, mode, loss_fn="ppo"), FakeBackend())
    assert on_fake_ppo.training_loss_fn() == ("stable_reinforce" if is_async else "ppo")


def test_an_unresolved_async_loss_names_what_resolves_it(tmp_path: Path) -> None:
    config = Config(log_path=tmp_path, async_config=AsyncConfig(1, 4))
    config.validate()  # None is valid: the backend resolves it
    with pytest.raises(ValueError, match="resolved per backend when the run starts"):
        config.training_loss_fn()


def test_the_async_default_resolves_per_backend(tmp_path: Path) -> None:
    config = Config(log_path=tmp_path, async_config=AsyncConfig(1, 4))
    tinker_like = with_async_loss(config, object())  # a backend naming no default of its own: the cookbook's
    assert tinker_like.training_loss_fn() == "stable_reinforce" and tinker_like.loss_fn_config is None
    local = with_async_loss(config, LocalBackend(log_dir=tmp_path / "backend"))
    assert local.training_loss_fn() == "importance_sampling" and local.loss_fn_config == {"tis_cap": 2.0}
    # Parameters the user gave are kept; an explicit loss is never replaced.
    own = with_async_loss(
        Config(log_path=tmp_path, loss_fn_config={"mis_cap": 3.0}, async_config=AsyncConfig(1, 4)),
        LocalBackend(log_dir=tmp_path / "b"),
    )
    assert own.loss_fn_config == {"mis_cap": 3.0}
    explicit = Config(log_path=tmp_path, async_config=AsyncConfig(1, 4, loss_fn="ppo"))
    assert with_async_loss(explicit, LocalBackend(log_dir=tmp_path / "c")) is explicit


def test_a_non_default_config_loss_conflicting_with_async_configs_is_refused(tmp_path: Path) -> None:
    config = Config(log_path=tmp_path, loss_fn="ppo", async_config=AsyncConfig(1, 4, loss_fn="stable_reinforce"))
    with pytest.raises(
        ConfigError, match=re.escape("Config.loss_fn='ppo' conflicts with AsyncConfig.loss_fn='stable_reinforce'")
    ):
        config.validate()
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert info.value.field == "loss_fn" and "AsyncConfig(..., loss_fn='ppo')" in str(info.value)


@pytest.mark.parametrize(
    ("loss_fn", "async_loss_fn"),
    [("importance_sampling", "stable_reinforce"), ("importance_sampling", "ppo"), ("ppo", "ppo")],
)
def test_config_loss_at_its_default_or_equal_to_async_configs_is_no_conflict(
    tmp_path: Path, loss_fn: str, async_loss_fn: str
) -> None:
    config = Config(log_path=tmp_path, loss_fn=loss_fn, async_config=AsyncConfig(1, 4, loss_fn=async_loss_fn))
    config.validate()
    assert config.training_loss_fn() == async_loss_fn


def test_an_unknown_async_loss_is_refused_naming_the_field(tmp_path: Path) -> None:
    config = Config(log_path=tmp_path, async_config=AsyncConfig(1, 4, loss_fn="reinforce_plus"))
    with pytest.raises(ConfigError, match="unknown loss 'reinforce_plus'") as info:
        config.validate()
    assert info.value.field == "async_config.loss_fn"


def test_stable_reinforce_on_an_sdk_without_it_names_the_sdk_and_the_version_it_needs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trio_rl.config import checks as config_checks

    # tinker 0.24.1's LossFnType: no stable_reinforce.
    monkeypatch.setattr(config_checks, "LOSS_FNS", ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro"))
    monkeypatch.setattr(compat, "SDK_VERSION", "tinker 0.24.1")
    config = with_async_loss(Config(log_path=tmp_path, async_config=AsyncConfig(1, 4)), object())
    with pytest.raises(
        ConfigError, match=re.escape("needs the tinker SDK 0.38 or later; the installed tinker 0.24.1")
    ) as info:
        config.validate()
    assert info.value.field == "async_config.loss_fn"


def test_stable_reinforce_with_a_discounted_kl_penalty_is_refused(tmp_path: Path) -> None:
    from trio_rl import KLReferenceConfig

    config = Config(
        log_path=tmp_path,
        async_config=AsyncConfig(1, 4, loss_fn="stable_reinforce"),
        kl_penalty_coef=0.1,
        kl_discount_factor=0.9,
        kl_reference_config=KLReferenceConfig("m"),
    )
    with pytest.raises(ConfigError, match="kl_discount_factor > 0 is not supported with loss_fn='stable_reinforce'"):
        config.validate()
    # Sync runs train Config.loss_fn, so the same penalty is fine there.
    Config(
        log_path=tmp_path, kl_penalty_coef=0.1, kl_discount_factor=0.9, kl_reference_config=KLReferenceConfig("m")
    ).validate()


@pytest.mark.parametrize("mode", list(MODES))
async def test_every_forward_backward_sends_the_resolved_loss(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    config = make_config(log_path, mode)
    await run_fake(config, FakeDataset(2, 4), backend)
    losses = {call.detail["loss_fn"] for call in backend.calls_of("forward_backward")}
    assert losses == {with_async_loss(config, backend).training_loss_fn()}


async def test_stable_reinforce_data_carries_provenance_on_every_datum(
    log_path: Path, autojump_clock: MockClock
) -> None:
    from trio_rl.loop import step_runner
    from trio_rl.rl.data import without_mask

    sent: list[object] = []

    def spy(datum: tinker_types.Datum) -> tinker_types.Datum:
        sent.append(datum)
        return without_mask(datum)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step_runner, "without_mask", spy)
        await run_fake(make_config(log_path, "pace"), FakeDataset(2, 4), FakeBackend(sample_latency=1.0))
    assert sent and all(getattr(d, "loss_fn_input_spans", None) for d in sent)


async def test_local_backend_refuses_stable_reinforce_before_any_work_naming_what_it_trains(
    tmp_path: Path,
) -> None:
    async with LocalBackend(log_dir=tmp_path / "backend") as backend:
        config = Config(log_path=tmp_path / "run", async_config=AsyncConfig(1, 1, loss_fn="stable_reinforce"))
        with pytest.raises(ConfigError) as info:
            await train(config, dataset=FakeDataset(1, 1), backend=backend)
    message = str(info.value)
    assert info.value.field == "async_config.loss_fn"
    assert "LocalBackend does not implement loss_fn='stable_reinforce'" in message
    assert "it trains cispo, cross_entropy, dro, importance_sampling, ppo" in message
    assert "AsyncConfig(..., loss_fn='importance_sampling')" in message
    assert not (tmp_path / "run").exists()


async def test_local_backend_trains_an_async_run_whose_loss_it_has(tmp_path: Path) -> None:
    async with LocalBackend(log_dir=tmp_path / "backend") as backend:
        config = Config(
            log_path=tmp_path / "run", max_steps=1, async_config=AsyncConfig(1, 1, loss_fn="importance_sampling")
        )
        result = await train(config, dataset=FakeDataset(1, 1), backend=backend)
    assert result.final_step == 1


def test_hf_backend_refuses_stable_reinforce_naming_itself_and_what_it_trains(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    from trio_rl.backends.hf import HFBackend

    backend = HFBackend(log_dir=tmp_path)
    with pytest.raises(ValueError, match="HFBackend does not implement loss_fn='stable_reinforce'; it trains cispo"):
        backend.check_loss_fn("stable_reinforce", None)
    backend.check_loss_fn("ppo", None)


@pytest.mark.parametrize(("flags", "expected"), [([], None), (["--loss-fn", "ppo"], "ppo")])
def test_the_command_lines_async_mode_trains_a_given_loss_or_else_the_backends_default(
    flags: list[str], expected: str | None
) -> None:
    from trio_rl.cli import CommonArgs, make_config, parse_args

    config = make_config(parse_args(CommonArgs, ["--mode", "async", *flags]))
    config.validate()
    # None: resolved per backend when the run starts (tests/test_cli.py follows it onto LocalBackend).
    assert config.async_config is not None and config.async_config.loss_fn == expected
