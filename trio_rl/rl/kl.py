"""The KL penalty against a reference model, as tinker-cookbook's ``incorporate_kl_penalty`` computes it.

The reference model's logprobs of each Datum's tokens are fetched by the
rollout worker as soon as the group's data exists (:func:`reference_logprob_diffs`),
so the trainer only does arithmetic (:func:`incorporate_kl_penalty`) when it
submits the data. With ``d = (sampled - reference) * mask`` per token and
``avg`` the mean of ``d`` over the action tokens of one ``forward_backward``,
each action token's advantage gains ``kl_penalty_coef * (avg - d)``, summed over
the future with ``kl_discount_factor`` when that is positive. ``kl_policy_base``
reports ``avg`` (an estimate of ``-KL[policy || reference]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import trio
from tinker import types as tinker_types

from .. import _tinker_compat as compat
from ..backends.protocol import SamplingClient
from .chunks import with_token_appended
from .data import MASK_KEY


@dataclass(frozen=True)
class KLReferenceConfig:
    """The reference model of the KL penalty (the cookbook's ``KLReferenceConfig``).

    Attributes:
        base_model: the model whose weights are the reference.
        load_checkpoint_path: weights to load instead of the base model's own.
    """

    base_model: str
    load_checkpoint_path: str | None = None


def _mask(datum: tinker_types.Datum) -> np.ndarray:
    return datum.loss_fn_inputs[MASK_KEY].to_numpy().astype(np.float64)


async def reference_logprob_diffs(client: SamplingClient, data: Sequence[tinker_types.Datum]) -> list[np.ndarray]:
    """Per Datum, ``(sampled - reference) * mask`` for each target token, scored concurrently.

    Raises:
        ValueError: the reference returned no logprob for an action token.
    """
    diffs: list[np.ndarray] = [np.zeros(0)] * len(data)

    async def one(index: int, datum: tinker_types.Datum) -> None:
        targets = datum.loss_fn_inputs["target_tokens"].to_numpy()
        # The unshifted sequence: the input plus the last target.
        sequence = with_token_appended(datum.model_input, int(targets[-1]))
        scored = (await client.compute_logprobs(sequence))[1:]
        mask = _mask(datum)
        if len(scored) != len(mask):
            raise ValueError(f"the reference scored {len(scored)} tokens of a {len(mask)}-token Datum")
        if any(lp is None for lp, m in zip(scored, mask, strict=True) if m > 0):
            raise ValueError("the reference model returned no logprob for an action token")
        reference = np.array([0.0 if lp is None else lp for lp in scored], dtype=np.float64)
        sampled = datum.loss_fn_inputs["logprobs"].to_numpy().astype(np.float64)
        diffs[index] = (sampled - reference) * mask

    async with trio.open_nursery() as nursery:
        for index, datum in enumerate(data):
            nursery.start_soon(one, index, datum)
    return diffs


def discounted_future_sum(x: np.ndarray, gamma: float) -> np.ndarray:
    """``out[t] = sum_k gamma**k * x[t + k]``."""
    out = np.empty_like(x)
    running = 0.0
    for t in range(len(x) - 1, -1, -1):
        running = x[t] + gamma * running
        out[t] = running
    return out


@dataclass(frozen=True)
class KLPenalty:
    """What :func:`incorporate_kl_penalty` did to one ``forward_backward``'s data.

    Attributes:
        data: the Datums with penalised advantages.
        diff_sum: the sum of ``(sampled - reference)`` over their action tokens.
        tokens: how many action tokens they have (so that steps of several
            submissions can report one ``kl_policy_base``).
    """

    data: list[tinker_types.Datum]
    diff_sum: float
    tokens: float


def incorporate_kl_penalty(
    data: Sequence[tinker_types.Datum], diffs: Sequence[np.ndarray], coef: float, discount: float
) -> KLPenalty:
    """Add ``coef * mask * (avg - diff)`` (discounted if ``discount > 0``) to each Datum's advantages."""
    if len(data) != len(diffs):
        raise ValueError(f"{len(data)} Datums but {len(diffs)} reference diffs")
    masks = [_mask(d) for d in data]
    tokens = float(sum(m.sum() for m in masks))
    diff_sum = float(sum(d.sum() for d in diffs))
    avg = diff_sum / tokens if tokens else 0.0
    penalised: list[tinker_types.Datum] = []
    for datum, diff, mask in zip(data, diffs, masks, strict=True):
        bonus = coef * mask * (avg - diff)
        if discount > 0:
            bonus = discounted_future_sum(bonus, discount)
        advantages = datum.loss_fn_inputs["advantages"].to_numpy().astype(np.float64) + bonus
        inputs = {**datum.loss_fn_inputs, "advantages": compat.tensor(advantages, "float32")}
        penalised.append(compat.with_loss_fn_inputs(datum, inputs))
    return KLPenalty(penalised, diff_sum, tokens)


POST_KL_KEYS = ("kl_pre_post_v1", "kl_pre_post_v2")
"""The metrics of :func:`post_update_kl`, under tinker-cookbook 0.6.1's names."""


async def post_update_kl(client: SamplingClient, data: Sequence[tinker_types.Datum]) -> dict[str, float]:
    """How far one step moved the policy on the data it trained: 0.6.1's ``compute_post_kl``.

    With ``d`` the sampled logprob minus the new weights' logprob on each action
    token, ``kl_pre_post_v1`` is the mean of ``d`` and ``kl_pre_post_v2`` half the
    mean of ``d**2``, over every action token of ``data``.

    Args:
        client: a sampling client of the weights after the step.
        data: the step's Datums (their ``logprobs`` are the sampler's, ``mask`` marks actions).

    Returns:
        The two metrics; empty when the data has no action token (0.6.1 reports NaN then).

    Raises:
        ValueError: the new weights scored no logprob for an action token.
    """
    diffs = await reference_logprob_diffs(client, data)
    flat = np.concatenate([diff[_mask(datum) > 0] for diff, datum in zip(diffs, data, strict=True)] or [np.zeros(0)])
    if flat.size == 0:
        return {}
    return {"kl_pre_post_v1": float(flat.mean()), "kl_pre_post_v2": float(0.5 * (flat**2).mean())}
