"""trio_rl.Config's fields from tinker-cookbook 0.6.1: num_epochs, compute_post_kl, termination,
rolling_save_every, and AsyncConfig.sampling_steps_ahead, each through a real (fake-backend) run."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from tests.pipeline_helpers import make_config, run_fake
from tests.test_termination import LimitedGroup
from trio_rl import AsyncConfig, Config, ConfigError, TerminationRewardPolicy
from trio_rl.loop.checkpoints import CheckpointLog
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec
from trio_rl.types import EnvGroupBuilder, RLDataset


def dataset(num_batches: int = 2) -> FakeDataset:
    return FakeDataset(num_batches=num_batches, batch_size=2, spec=FakeEnvSpec(group_size=2))


async def test_num_epochs_replays_the_dataset(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    result = await run_fake(make_config(tmp_path / "a", "sync", num_epochs=3), dataset())
    assert result.final_step == 6 and result.trained_groups == 12
    assert result.step_metrics[-1]["progress/done_frac"] == 1.0
    capped = await run_fake(make_config(tmp_path / "b", "sync", num_epochs=3, max_steps=4), dataset())
    assert capped.final_step == 4 and capped.stopped_by_max_steps


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_num_epochs_must_be_a_positive_integer(tmp_path: Path, bad: float) -> None:
    with pytest.raises(ConfigError, match="num_epochs"):
        Config(log_path=tmp_path, num_epochs=bad).validate()  # type: ignore[arg-type]


async def test_compute_post_kl_logs_the_cookbooks_keys(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    with_kl = await run_fake(make_config(tmp_path / "a", "sync", compute_post_kl=True), dataset())
    for step in with_kl.step_metrics:
        assert math.isfinite(step["kl_pre_post_v1"]) and step["kl_pre_post_v2"] >= 0
    without = await run_fake(make_config(tmp_path / "b", "sync"), dataset())
    assert not any("kl_pre_post_v1" in step for step in without.step_metrics)


async def test_compute_post_kl_scores_with_the_new_weights(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5, record_calls=True)
    await run_fake(make_config(tmp_path, "sync", compute_post_kl=True), dataset(), backend)
    scored = [c.version for c in backend.calls if c.kind == "compute_logprobs"]
    # Each step's 4 datums are scored by the weights that step made (versions 1 and 2).
    assert sorted(scored) == [1] * 4 + [2] * 4


async def test_rolling_checkpoints_fill_the_steps_save_every_skips(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = make_config(tmp_path, "sync", save_every=4, rolling_save_every=2)
    await run_fake(config, dataset(num_batches=6))
    rows = [(r.name, r.reason) for r in CheckpointLog(tmp_path).all()]
    assert rows == [("000002", "rolling"), ("000004", "periodic"), ("000006", "rolling"), ("final", "final")]


def test_rolling_save_every_must_not_be_negative(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="rolling_save_every"):
        Config(log_path=tmp_path, rolling_save_every=-1).validate()


class LimitedDataset(RLDataset):
    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [LimitedGroup()]

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize(
    ("termination", "mean_total"), [(None, 1.5), (TerminationRewardPolicy(zero_reward_on_limit=True), 0.75)]
)
async def test_termination_clamps_limit_stopped_rewards_in_a_run(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    termination: TerminationRewardPolicy | None,
    mean_total: float,
) -> None:
    config = make_config(tmp_path, "sync", termination=termination)
    with trio.fail_after(60):
        async with FakeBackend() as backend:
            from trio_rl import train

            result = await train(config, dataset=LimitedDataset(), backend=backend)
    # One env stops on max_tokens, one completes; each earns 0.5 from its step and 1.0 from the group.
    assert result.step_metrics[0]["env/all/reward/total"] == pytest.approx(mean_total)


def test_termination_survives_config_json(tmp_path: Path) -> None:
    config = Config(log_path=tmp_path, termination=TerminationRewardPolicy(zero_reward_on_limit=True))
    again = Config.from_json(json.loads(json.dumps(config.to_json())))
    assert again.termination == config.termination


def test_sampling_steps_ahead_is_max_steps_off_policy(tmp_path: Path) -> None:
    assert AsyncConfig(None, 4, sampling_steps_ahead=2).max_steps_off_policy == 2
    assert AsyncConfig(None, 4, sampling_steps_ahead=2) == AsyncConfig(2, 4)
    assert AsyncConfig(2, 4, sampling_steps_ahead=2) == AsyncConfig(2, 4)
    with pytest.raises(ConfigError, match=r"async_config\.sampling_steps_ahead: 3 differs from max_steps_off_policy=2"):
        AsyncConfig(2, 4, sampling_steps_ahead=3)
    with pytest.raises(ConfigError, match=r"async_config\.max_steps_off_policy"):
        AsyncConfig(None, 4)
    config = Config(log_path=tmp_path, async_config=AsyncConfig(None, 4, sampling_steps_ahead=1))
    assert Config.from_json(json.loads(json.dumps(config.to_json()))) == config
