"""Every concept trio_rl measures is written under tinker-cookbook 0.6.1's key (see bench/cookbook_keys.py)."""

from __future__ import annotations

import json

import pytest

from bench.cookbook_keys import COOKBOOK_KEYS, RENAMED_AWAY, compare, trio_rl_keys
from trio_rl import TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition, trajectory_metrics
from trio_rl import _tinker_compat as compat


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_no_cookbook_key_of_a_concept_trio_rl_measures_is_missing(mode: str) -> None:
    ours = await trio_rl_keys(mode)
    result = compare(set(json.loads(COOKBOOK_KEYS.read_text())[mode]), ours)
    assert result["missing"] == []
    assert not ours & RENAMED_AWAY
    # The concepts the issue named, written under the cookbook's keys.
    for key in ("optim/entropy", "optim/kl_sample_train_v1", "progress/done_frac", "tokens/cumulative/trained",
                "time/train_step", "test/env/all/reward/total", "training_client/step", "async/staleness_mean"):  # fmt: skip
        assert key in ours


def _group(reward: float) -> TrajectoryGroup:
    ob = compat.model_input_from_ints([1, 2])
    transition = Transition(ob, TokensWithLogprobs([3], [-0.5]), reward, True)
    return TrajectoryGroup([Trajectory([transition], ob)], [0.0], [{}])


def test_per_tag_keys_only_when_a_tag_selects_a_strict_subset() -> None:
    groups = [_group(1.0), _group(0.0)]
    same = trajectory_metrics(groups, [["math"], ["math"]])
    assert not any(k.startswith("env/math/") for k in same)
    split = trajectory_metrics(groups, [["math", "easy"], ["math"]])
    # As the cookbook: once one tag is a strict subset, every tag is written.
    assert split["env/easy/reward/total"] == 1.0 and split["env/math/reward/total"] == 0.5
