"""From trajectory groups to training data: advantages, filtering and Datum assembly."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from tinker import types as tinker_types

from .. import _tinker_compat as compat
from ..types import PARSE_ERROR_MASKED_METRIC_KEY, TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition
from .chunks import Position, model_input_from_positions, observation_positions, target_ids

T = TypeVar("T")

logger = logging.getLogger(__name__)

PROVENANCE_LOSSES = frozenset({"stable_reinforce"})
"""Losses that read a Datum's provenance (which sampled sequence each token came from)."""

MASK_KEY = "mask"
"""The action mask every Datum carries, as in the cookbook; :func:`without_mask` drops it before submission."""


def compute_advantages(groups: Sequence[TrajectoryGroup]) -> list[list[float]]:
    """Group-centred advantages: each trajectory's total reward minus its group's mean."""
    advantages: list[list[float]] = []
    for group in groups:
        rewards = group.get_total_rewards()
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        advantages.append([r - mean for r in rewards])
    return advantages


def rewards_are_constant(rewards: Sequence[float]) -> bool:
    """Whether every one of a group's total ``rewards`` is the same (no learning signal): the one test of it."""
    return all(r == rewards[0] for r in rewards)


def is_constant_reward(group: TrajectoryGroup) -> bool:
    """Whether every trajectory of ``group`` got the same total reward (no learning signal)."""
    return rewards_are_constant(group.get_total_rewards())


def remove_constant_reward_groups(groups: Sequence[TrajectoryGroup]) -> list[TrajectoryGroup]:
    """Drop groups whose advantages would all be zero, as tinker-cookbook 0.6.1 does.

    Args:
        groups: the batch's trajectory groups.

    Returns:
        The groups whose trajectories' total rewards differ; if every group's
        are constant, the first group alone (a warning is logged), so that a
        caller never gets an empty batch. Empty only for an empty ``groups``.
    """
    return without_constant_rewards(groups, is_constant_reward)


def without_constant_rewards(items: Sequence[T], constant: Callable[[T], bool]) -> list[T]:
    """``items`` less those ``constant`` says have constant rewards; if all have, the first alone.

    The one place of tinker-cookbook 0.6.1's rule (``remove_constant_reward_groups``),
    for trajectory groups and for the sync loop's finished groups alike.
    """
    kept = [item for item in items if not constant(item)]
    if kept or not items:
        return kept
    logger.warning("All rewards are uniform. There will be no gradient")
    return list(items[:1])


@dataclass
class _Sequence:
    """A growing token sequence with per-token sampling logprob, advantage and mask."""

    tokens: list[Position] = field(default_factory=list[Position])
    """Token ids, and the positions of any image (:mod:`~trio_rl.rl.chunks`)."""
    logprobs: list[float] = field(default_factory=list[float])
    advantages: list[float] = field(default_factory=list[float])
    mask: list[float] = field(default_factory=list[float])
    spans: list[Any] | None = field(default_factory=list[Any])
    """Where each token came from while every action has a ``sequence_id`` (None once one does not)."""
    chunked: bool = False
    """Whether an observation held a chunk other than tokens (an image)."""

    def extend(
        self, tokens: Sequence[Position], logprobs: Sequence[float] | None, advantage: float, trained: bool
    ) -> None:
        self.tokens.extend(tokens)
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(tokens))
        self.advantages.extend([advantage if trained else 0.0] * len(tokens))
        self.mask.extend([1.0 if trained else 0.0] * len(tokens))

    def note_provenance(self, new_ob_tokens: int, action: TokensWithLogprobs) -> None:
        """Record that the new observation tokens end the prompt of ``action``'s request, then its tokens."""
        if self.spans is None:
            return
        if action.sequence_id is None or not compat.HAS_PROVENANCE:
            # As in tinker-cookbook 0.6.1: a turn that adds no token needs no provenance.
            if new_ob_tokens or action.tokens:
                self.spans = None
            return
        if new_ob_tokens:
            self.spans.append(
                compat.prompt_span(action.sequence_id, offset=len(self.tokens) - new_ob_tokens, length=new_ob_tokens)
            )
        if action.tokens:
            self.spans.append(compat.sampled_span(action.sequence_id, length=len(action.tokens)))

    def extend_action(self, action: TokensWithLogprobs, advantage: float, masked: bool, turn: int) -> None:
        if not action.tokens:
            return  # an initial-observation overflow: nothing was sampled
        if action.maybe_logprobs is None:
            # Zeros would silently turn every importance ratio into exp(logprob):
            # the cookbook raises, and so do we.
            raise ValueError(f"turn {turn}: the sampler returned no logprobs for the action; RL data needs them")
        if len(action.maybe_logprobs) != len(action.tokens):
            raise ValueError(
                f"turn {turn}: {len(action.tokens)} action tokens but {len(action.maybe_logprobs)} logprobs"
            )
        self.extend(action.tokens, action.maybe_logprobs, 0.0 if masked else advantage, trained=not masked)

    def to_datum(self, loss_fn: str) -> tinker_types.Datum:
        # The model reads tokens[:-1] and is scored on predicting tokens[1:].
        if self.chunked:
            # Images stay in the input, whole; their positions are targets of id 0, never trained.
            model_input, targets = model_input_from_positions(self.tokens[:-1]), target_ids(self.tokens[1:])
        else:
            ids = cast(list[int], self.tokens)  # no chunk position without an image
            model_input, targets = compat.model_input_from_ints(ids[:-1]), ids[1:]
        inputs = {
            "target_tokens": compat.tensor(targets, "int64"),
            MASK_KEY: compat.tensor(self.mask[1:], "float32"),
        }
        if loss_fn == "cross_entropy":
            inputs["weights"] = compat.tensor(self.mask[1:], "float32")
        else:
            inputs["logprobs"] = compat.tensor(self.logprobs[1:], "float32")
            inputs["advantages"] = compat.tensor(self.advantages[1:], "float32")
        datum = tinker_types.Datum(model_input=model_input, loss_fn_inputs=inputs)
        if loss_fn in PROVENANCE_LOSSES and self.spans:
            # The input drops the sequence's last token, the targets its first.
            targets = compat.drop_first(self.spans)
            # A datum none of whose targets was sampled gets none, as in tinker-cookbook 0.6.1.
            if any(compat.is_sampled_span(span) for span in targets):
                return compat.with_provenance(datum, compat.drop_last(self.spans), targets)
        return datum


def trajectory_to_data(
    trajectory: Trajectory, advantage: float, loss_fn: str = "importance_sampling"
) -> list[tinker_types.Datum]:
    """Turn one trajectory into training data.

    Turns whose observation extends the sequence so far (the usual multi-turn chat
    case) are merged into one Datum; an observation that does not extend it starts
    a new Datum. Observation tokens carry zero advantage and zero logprob; action
    tokens carry the trajectory's advantage and the sampler's logprobs, except
    in turns whose metrics set ``parse_error_masked`` (mask and advantage 0).
    Every Datum also carries the action ``mask`` (see :func:`without_mask`).

    An observation may hold chunks other than tokens (images), as in
    tinker-cookbook 0.6.1: the Datum's input keeps them whole, and their
    positions are never trained. Only a backend that takes such inputs
    (TinkerBackend, FakeBackend) can train that data; the local backends refuse it.

    Raises:
        ValueError: an action was sampled without logprobs (they are never replaced by zeros), or an
            observation's image has no length (no ``expected_tokens``).

    Args:
        trajectory: the episode.
        advantage: its advantage, applied to every action token.
        loss_fn: ``cross_entropy`` gets ``weights`` (the action mask); RL losses get
            ``logprobs`` and ``advantages``.

    Returns:
        One Datum per maximal run of extending turns.
    """
    data: list[tinker_types.Datum] = []
    # Provenance is only gathered for the losses that read it: its spans cost an object per turn.
    tracks = loss_fn in PROVENANCE_LOSSES
    current = _Sequence(spans=[] if tracks else None)
    for turn, transition in enumerate(trajectory.transitions):
        ob_tokens, chunked = observation_positions(transition.ob, turn)
        if ob_tokens[: len(current.tokens)] == current.tokens:
            new_ob = len(ob_tokens) - len(current.tokens)
            current.extend(ob_tokens[len(current.tokens) :], None, 0.0, trained=False)
        else:
            if len(current.tokens) > 1:
                data.append(current.to_datum(loss_fn))
            current = _Sequence(spans=[] if tracks else None)
            new_ob = len(ob_tokens)
            current.extend(ob_tokens, None, 0.0, trained=False)
        current.chunked = current.chunked or chunked
        current.note_provenance(new_ob, transition.ac)
        current.extend_action(transition.ac, advantage, is_masked(transition), turn)
    if len(current.tokens) > 1:
        data.append(current.to_datum(loss_fn))
    return data


def is_masked(transition: Transition) -> bool:
    """Whether the env marked this turn's action as one not to train on (the cookbook's parse-error masking)."""
    return float(transition.metrics.get(PARSE_ERROR_MASKED_METRIC_KEY, 0.0)) >= 1.0


TokenVersions = tuple[tuple[int, int], ...]
"""A tally of tokens by the weights version that produced them: ``((version, tokens), ...)``, by version."""


def trained_tokens_by_version(trajectories: Sequence[Trajectory]) -> tuple[int, TokenVersions | None]:
    """The action tokens that carry loss weight in the Datums of ``trajectories``, and their weights versions.

    Those are the sampled tokens of every turn that is not masked (see
    :func:`trajectory_to_data`). The per-token versions are tallied here, where
    the trajectories become data, so that no per-token list outlives them.

    Returns:
        Their count, and their tally by version; None where a trained token's
        version is unknown (its sampler did not say).
    """
    # On every group's path: no tally unless some sampler gave versions.
    trained = 0
    tally: Counter[int] | None = None
    known = True
    for trajectory in trajectories:
        for transition in trajectory.transitions:
            action = transition.ac
            tokens = action.tokens
            if not tokens or is_masked(transition):
                continue
            trained += len(tokens)
            versions = action.token_versions
            if versions is None:
                known = False
            elif known:
                tally = tally if tally is not None else Counter()
                tally.update(versions)
    if not known:
        return trained, None
    return trained, () if tally is None else tuple(sorted(tally.items()))


def assemble_training_data(
    groups: Sequence[TrajectoryGroup], loss_fn: str = "importance_sampling"
) -> list[tinker_types.Datum]:
    """Advantages, then Datums, for a batch of groups, in the order given.

    Trajectories whose advantage is exactly zero still produce data (their
    observation tokens shape nothing, their action tokens get zero weight in the
    RL losses), so the number of Datums does not depend on reward values.
    """
    data: list[tinker_types.Datum] = []
    for group, advantages in zip(groups, compute_advantages(groups), strict=True):
        for trajectory, advantage in zip(group.trajectories_G, advantages, strict=True):
            data.extend(trajectory_to_data(trajectory, advantage, loss_fn))
    return data


def without_mask(datum: tinker_types.Datum) -> tinker_types.Datum:
    """``datum`` without its ``mask`` input, as it is submitted (the cookbook's ``_remove_mask``)."""
    if MASK_KEY not in datum.loss_fn_inputs:
        return datum
    inputs = {k: v for k, v in datum.loss_fn_inputs.items() if k != MASK_KEY}
    return compat.with_loss_fn_inputs(datum, inputs)
