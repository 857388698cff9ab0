"""trio_rl's Datum assembly for stable_reinforce against tinker-cookbook 0.6.1's ``rl/data_processing.py``.

Random multi-turn trajectories (extending and fresh observations, actions without a
``sequence_id``, empty actions, parse-error-masked turns) go through both
``trajectory_to_data``; every Datum must agree on tokens, targets, advantages, mask and
both provenance span lists.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from tinker import types as tinker_types
from tinker_cookbook.completers import TokensWithLogprobs as CookbookTokens
from tinker_cookbook.rl import data_processing
from tinker_cookbook.rl.types import Trajectory as CookbookTrajectory
from tinker_cookbook.rl.types import Transition as CookbookTransition

import trio_rl
from trio_rl.rl.data import trajectory_to_data


def _random_trajectories(rng: random.Random) -> tuple[Any, trio_rl.Trajectory]:
    cookbook: list[Any] = []
    ours: list[trio_rl.Transition] = []
    sequence: list[int] = []
    turns = rng.randint(1, 4)
    for i in range(turns):
        if sequence and rng.random() < 0.8:
            ob = sequence + [rng.randrange(50) for _ in range(rng.randint(0, 3))]
        else:
            ob = [rng.randrange(50) for _ in range(rng.randint(2, 4))]
        tokens = [rng.randrange(50) for _ in range(0 if rng.random() < 0.1 else rng.randint(1, 4))]
        logprobs = [-rng.random() for _ in tokens]
        sequence_id = None if rng.random() < 0.1 else f"s{rng.randrange(10**6)}"
        metrics = {"parse_error_masked": 1.0} if rng.random() < 0.1 else {}
        model_input = tinker_types.ModelInput.from_ints(ob)
        done = i == turns - 1
        cookbook.append(
            CookbookTransition(
                ob=model_input,
                ac=CookbookTokens(tokens, logprobs, sequence_id=sequence_id),
                reward=0.0,
                episode_done=done,
                metrics=dict(metrics),
            )
        )
        action = trio_rl.TokensWithLogprobs(tokens, logprobs, sequence_id=sequence_id)
        ours.append(trio_rl.Transition(model_input, action, 0.0, done, dict(metrics)))
        sequence = ob + tokens
    final = tinker_types.ModelInput.from_ints(sequence)
    return CookbookTrajectory(transitions=cookbook, final_ob=final), trio_rl.Trajectory(ours, final)


@pytest.mark.parametrize("seed", range(4))
def test_stable_reinforce_datums_and_their_provenance_match_the_cookbooks(seed: int) -> None:
    rng = random.Random(seed)
    with_provenance = 0
    for _ in range(300):
        cookbook_trajectory, trajectory = _random_trajectories(rng)
        advantage = rng.choice([0.0, 1.0, -0.5])
        expected = data_processing.trajectory_to_data(cookbook_trajectory, advantage)
        got = trajectory_to_data(trajectory, advantage, loss_fn="stable_reinforce")
        assert len(got) == len(expected)
        for theirs, ours in zip(expected, got, strict=True):
            assert ours.model_input.to_ints() == theirs.model_input.to_ints()
            for key in ("target_tokens", "advantages", "mask"):
                assert ours.loss_fn_inputs[key].tolist() == pytest.approx(theirs.loss_fn_inputs[key].tolist())
            assert ours.model_input_spans == theirs.model_input_spans
            assert ours.loss_fn_input_spans == theirs.loss_fn_input_spans
            with_provenance += ours.loss_fn_input_spans is not None
    assert with_provenance > 100
