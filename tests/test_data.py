"""Advantages, constant-reward filtering and Datum assembly."""

from __future__ import annotations

import pytest
from tinker import types as tinker_types

from trio_rl import (
    TokensWithLogprobs,
    Trajectory,
    TrajectoryGroup,
    Transition,
    assemble_training_data,
    compute_advantages,
    remove_constant_reward_groups,
    trajectory_to_data,
)
from trio_rl.base.splitting import split_evenly
from trio_rl.rl.data import without_mask


def ob(tokens: list[int]) -> tinker_types.ModelInput:
    return tinker_types.ModelInput.from_ints(tokens)


def turn(ob_tokens: list[int], ac_tokens: list[int], logprobs: list[float], reward: float = 0.0) -> Transition:
    return Transition(ob(ob_tokens), TokensWithLogprobs(ac_tokens, logprobs), reward, False)


def group(rewards: list[float]) -> TrajectoryGroup:
    trajectories = [Trajectory([turn([1], [2], [-0.1], r)], ob([1, 2])) for r in rewards]
    return TrajectoryGroup(trajectories, [0.0] * len(rewards), [{} for _ in rewards])


def inputs(datum: tinker_types.Datum, key: str) -> list[float]:
    return datum.loss_fn_inputs[key].tolist()


def test_advantages_are_centred_per_group() -> None:
    groups = [group([1.0, 0.0, 0.5]), group([2.0, 2.0])]
    assert compute_advantages(groups) == [[0.5, -0.5, 0.0], [0.0, 0.0]]


def test_total_reward_adds_final_group_reward() -> None:
    g = group([1.0, 0.0])
    g.final_rewards_G = [0.5, 0.25]
    assert g.get_total_rewards() == [1.5, 0.25]


def test_remove_constant_reward_groups_keeps_only_mixed_groups() -> None:
    mixed = group([1.0, 0.0])
    assert remove_constant_reward_groups([group([1.0, 1.0]), mixed, group([0.0, 0.0])]) == [mixed]
    assert remove_constant_reward_groups([]) == []


def test_remove_constant_reward_groups_keeps_the_first_when_every_group_is_constant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # tinker-cookbook 0.6.1 (rl/data_processing.py) logs and returns trajectory_groups_P[0:1].
    first, second = group([1.0, 1.0]), group([0.0, 0.0])
    with caplog.at_level("WARNING", logger="trio_rl.rl.data"):
        assert remove_constant_reward_groups([first, second]) == [first]
    assert "All rewards are uniform" in caplog.text


def test_single_turn_datum_is_shifted_and_masks_the_observation() -> None:
    trajectory = Trajectory([turn([10, 11, 12], [20, 21], [-0.5, -0.25])], ob([10, 11, 12, 20, 21]))
    (datum,) = trajectory_to_data(trajectory, advantage=2.0)
    assert datum.model_input.to_ints() == [10, 11, 12, 20]
    assert inputs(datum, "target_tokens") == [11, 12, 20, 21]
    assert inputs(datum, "logprobs") == [0.0, 0.0, -0.5, -0.25]
    assert inputs(datum, "advantages") == [0.0, 0.0, 2.0, 2.0]
    assert "weights" not in datum.loss_fn_inputs


def test_extending_turns_merge_into_one_datum() -> None:
    first = turn([1, 2], [3], [-0.3])
    second = turn([1, 2, 3, 4], [5, 6], [-0.5, -0.6])
    (datum,) = trajectory_to_data(Trajectory([first, second], ob([1, 2, 3, 4, 5, 6])), advantage=1.0)
    assert inputs(datum, "target_tokens") == [2, 3, 4, 5, 6]
    assert inputs(datum, "advantages") == [0.0, 1.0, 0.0, 1.0, 1.0]
    assert inputs(datum, "logprobs") == pytest.approx([0.0, -0.3, 0.0, -0.5, -0.6])


def test_a_turn_that_does_not_extend_starts_a_new_datum() -> None:
    first = turn([1, 2], [3], [-0.3])
    second = turn([9, 9], [7], [-0.7])
    data = trajectory_to_data(Trajectory([first, second], ob([9, 9, 7])), advantage=1.0)
    assert [d.model_input.to_ints() for d in data] == [[1, 2], [9, 9]]
    assert [inputs(d, "target_tokens") for d in data] == [[2, 3], [9, 7]]


def test_cross_entropy_data_carries_weights_instead_of_rl_inputs() -> None:
    trajectory = Trajectory([turn([1, 2], [3, 4], [-0.1, -0.2])], ob([1, 2, 3, 4]))
    (datum,) = trajectory_to_data(trajectory, advantage=1.0, loss_fn="cross_entropy")
    assert inputs(datum, "weights") == [0.0, 1.0, 1.0]
    # The action mask travels with the Datum, and is dropped when it is submitted.
    assert set(datum.loss_fn_inputs) == {"target_tokens", "weights", "mask"}
    assert set(without_mask(datum).loss_fn_inputs) == {"target_tokens", "weights"}


def test_every_datum_carries_the_action_mask() -> None:
    first = turn([1, 2], [3], [-0.3])
    second = turn([1, 2, 3, 4], [5, 6], [-0.5, -0.6])
    (datum,) = trajectory_to_data(Trajectory([first, second], ob([1, 2, 3, 4, 5, 6])), advantage=1.0)
    assert inputs(datum, "mask") == [0.0, 1.0, 0.0, 1.0, 1.0]


def test_a_parse_error_masked_turn_trains_nothing_while_the_others_do() -> None:
    first = turn([1, 2], [3], [-0.3])
    first.metrics["parse_error_masked"] = 1.0
    second = turn([1, 2, 3, 4], [5, 6], [-0.5, -0.6])
    (datum,) = trajectory_to_data(Trajectory([first, second], ob([1, 2, 3, 4, 5, 6])), advantage=1.0)
    assert inputs(datum, "mask") == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert inputs(datum, "advantages") == [0.0, 0.0, 0.0, 1.0, 1.0]


def test_missing_sampler_logprobs_raise_instead_of_becoming_zeros() -> None:
    no_logprobs = Transition(ob([1, 2]), TokensWithLogprobs([3, 4], None), 0.0, True)
    with pytest.raises(ValueError, match="turn 0: the sampler returned no logprobs"):
        trajectory_to_data(Trajectory([no_logprobs], ob([1, 2, 3, 4])), advantage=1.0)


def test_assemble_training_data_uses_group_advantages_in_order() -> None:
    data = assemble_training_data([group([1.0, 0.0]), group([3.0, 1.0])])
    assert [inputs(d, "advantages")[-1] for d in data] == [0.5, -0.5, 1.0, -1.0]


def test_split_evenly_sizes_differ_by_at_most_one() -> None:
    assert [len(c) for c in split_evenly(list(range(7)), 3)] == [3, 2, 2]
    assert split_evenly([], 2) == [[], []]


def test_stable_reinforce_data_carries_which_sampled_sequence_each_token_came_from() -> None:
    from tinker import types as t

    first = Transition(ob([1, 2]), TokensWithLogprobs([3], [-0.3], sequence_id="s1"), 0.0, False)
    second = Transition(ob([1, 2, 3, 4]), TokensWithLogprobs([5, 6], [-0.5, -0.6], sequence_id="s2"), 0.0, True)
    trajectory = Trajectory([first, second], ob([1, 2, 3, 4, 5, 6]))
    (datum,) = trajectory_to_data(trajectory, advantage=1.0, loss_fn="stable_reinforce")
    # Tokens 1 2 | 3 | 4 | 5 6: s1's prompt, s1's sample, s2's prompt (from offset 3), s2's sample.
    assert datum.model_input_spans == [
        t.PromptProvenanceSpan(sequence_id="s1", offset=0, length=2),
        t.SampledProvenanceSpan(sequence_id="s1", length=1),
        t.PromptProvenanceSpan(sequence_id="s2", offset=3, length=1),
        t.SampledProvenanceSpan(sequence_id="s2", length=1),
    ]
    assert datum.loss_fn_input_spans == [
        t.PromptProvenanceSpan(sequence_id="s1", offset=1, length=1),
        t.SampledProvenanceSpan(sequence_id="s1", length=1),
        t.PromptProvenanceSpan(sequence_id="s2", offset=3, length=1),
        t.SampledProvenanceSpan(sequence_id="s2", length=2),
    ]
    # Other losses do not need provenance, and an action without an id drops it.
    (plain,) = trajectory_to_data(trajectory, advantage=1.0)
    assert plain.model_input_spans is None
    anonymous = Trajectory([turn([1, 2], [3], [-0.3])], ob([1, 2, 3]))
    assert trajectory_to_data(anonymous, 1.0, loss_fn="stable_reinforce")[0].model_input_spans is None


def test_provenance_survives_a_turn_that_adds_no_token_without_a_sequence_id() -> None:
    # tinker-cookbook 0.6.1: only a turn that adds tokens without a sequence_id drops the datum's provenance.
    first = Transition(ob([1, 2]), TokensWithLogprobs([3], [-0.3], sequence_id="s1"), 0.0, False)
    empty = Transition(ob([1, 2, 3]), TokensWithLogprobs([], [], sequence_id=None), 0.0, True)
    (datum,) = trajectory_to_data(Trajectory([first, empty], ob([1, 2, 3])), 1.0, loss_fn="stable_reinforce")
    assert datum.loss_fn_input_spans is not None


def test_a_datum_none_of_whose_targets_was_sampled_gets_no_provenance() -> None:
    # One prompt token and one sampled token: the target is sampled, provenance is kept.
    kept = Trajectory([Transition(ob([1]), TokensWithLogprobs([3], [-0.3], sequence_id="s1"), 0.0, True)], ob([1, 3]))
    assert trajectory_to_data(kept, 1.0, loss_fn="stable_reinforce")[0].loss_fn_input_spans is not None
    # A new observation that does not extend the sequence flushes a datum of prompt tokens only
    # when the action sampled nothing (an initial-observation overflow): no sampled target, no provenance.
    overflow = Transition(ob([1, 2, 3]), TokensWithLogprobs([], [], sequence_id="s1"), 0.0, True)
    (datum,) = trajectory_to_data(Trajectory([overflow], ob([1, 2, 3])), 1.0, loss_fn="stable_reinforce")
    assert datum.loss_fn_input_spans is None
