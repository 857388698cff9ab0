"""Off-policy corrections of ``importance_sampling`` on the in-process backends, and their statistics.

With ``q`` the sampler's logprob of a token (the datum's ``logprobs``, which in
flight come from whichever weights sampled that very token), ``p`` the
learner's, and ``w = exp(p - q)``, plain ``importance_sampling`` trains
``-w * A``, whose gradient is ``-w * A * grad(p)``: one token sampled where
the weights have since moved far can dominate a step. A correction replaces
``w`` by a coefficient ``c(w)``, held constant, and trains
``-c(w) * exp(p - stop_gradient(p)) * A``: its value is ``-c(w) * A`` and its
gradient ``-c(w) * A * grad(p)``; with ``c(w) = w`` that is plain
``importance_sampling`` again. Chosen by ``loss_fn_config`` keys:

* ``tis_cap: C``: truncated importance sampling, ``c = min(w, C)``;
* ``mis_cap: C``: masked importance sampling, ``c = w`` where ``w <= C``, else 0;
* ``icepop_low: a`` and ``icepop_high: b``: ICEPOP's two-sided mask, ``c = w``
  where ``a <= w <= b``, else 0;
* ``geo_mask_low: l`` and ``geo_mask_high: h``: a geometric sequence mask, every
  token of a datum whose ``exp(mean(log w))`` over its trained tokens lies
  outside ``[l, h]`` gets ``c = 0``; it combines with one of the token-level
  corrections above (alone, kept tokens keep ``c = w``).

The defaults each framework documents: SkyRL's ``OffPolicyCorrectionConfig``
(``skyrl_train`` config) caps token TIS at 2.0 and sets a geometric mask of
``[0.99, 1.01]``; verl's and ms-swift's token mask threshold is 2.0; the ICEPOP
band in its authors' write-up is ``[0.5, 5.0]``. Here every threshold must be
given; none is filled in.

The trained tokens are those the loss can reach: a nonzero advantage (and a
nonzero ``weights`` where the datum has them). Their statistics go into
``loss_fn_outputs``' metrics as sums (``:sum``) and maxima (``:max``), so that
the loop can add them over the several ``forward_backward`` calls of one step
(:func:`trio_rl.loop.step_metrics.offpolicy_metrics`, with
:func:`trio_rl.base.reduced_metrics.add_reduced`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

TOKEN_CORRECTIONS: dict[str, tuple[str, ...]] = {
    "tis": ("tis_cap",),
    "mis": ("mis_cap",),
    "icepop": ("icepop_low", "icepop_high"),
}
"""Each token-level correction and the ``loss_fn_config`` keys that choose it."""

SEQUENCE_MASK_KEYS = ("geo_mask_low", "geo_mask_high")
"""The ``loss_fn_config`` keys of the geometric sequence mask."""

CORRECTION_KEYS = frozenset(k for keys in TOKEN_CORRECTIONS.values() for k in keys) | frozenset(SEQUENCE_MASK_KEYS)
"""Every ``loss_fn_config`` key of a correction."""


@dataclass(frozen=True)
class Correction:
    """One parsed choice of correction.

    Attributes:
        token: ``"tis"``, ``"mis"``, ``"icepop"`` or ``None`` (``c = w``).
        low: ICEPOP's lower bound (0 otherwise).
        high: the cap of TIS/MIS, ICEPOP's upper bound (infinite without one).
        sequence: the geometric mask's ``(low, high)``, or ``None``.
    """

    token: str | None = None
    low: float = 0.0
    high: float = float("inf")
    sequence: tuple[float, float] | None = None

    @property
    def active(self) -> bool:
        """Whether any correction is chosen (else the loss is plain ``importance_sampling``)."""
        return self.token is not None or self.sequence is not None


def parse_correction(config: Mapping[str, float]) -> Correction:
    """The correction ``loss_fn_config`` chooses.

    Raises:
        ValueError: for two token-level corrections, a pair given by half, or
            thresholds that are not positive and ordered.
    """
    chosen = [name for name, keys in TOKEN_CORRECTIONS.items() if any(k in config for k in keys)]
    if len(chosen) > 1:
        raise ValueError(f"loss_fn_config chooses {' and '.join(chosen)}; choose at most one token-level correction")
    for keys in (*TOKEN_CORRECTIONS.values(), SEQUENCE_MASK_KEYS):
        given = [k for k in keys if k in config]
        if given and len(given) != len(keys):
            raise ValueError(f"loss_fn_config gives {given[0]} without {next(k for k in keys if k not in config)}")
    sequence = None
    if SEQUENCE_MASK_KEYS[0] in config:
        sequence = _bounds(config, *SEQUENCE_MASK_KEYS)
    if not chosen:
        return Correction(sequence=sequence)
    token = chosen[0]
    if token == "icepop":
        low, high = _bounds(config, "icepop_low", "icepop_high")
        return Correction(token, low, high, sequence)
    cap = float(config[f"{token}_cap"])
    if not cap > 0:
        raise ValueError(f"loss_fn_config {token}_cap must be > 0, got {cap}")
    return Correction(token, high=cap, sequence=sequence)


def _bounds(config: Mapping[str, float], low_key: str, high_key: str) -> tuple[float, float]:
    low, high = float(config[low_key]), float(config[high_key])
    if not 0 < low <= high:
        raise ValueError(f"loss_fn_config needs 0 < {low_key} <= {high_key}, got {low}, {high}")
    return low, high


def trained_tokens(inputs: Mapping[str, Tensor]) -> Tensor:
    """Where a datum's loss can be nonzero: a nonzero advantage and, where given, a nonzero weight."""
    keep = inputs["advantages"] != 0
    weights = inputs.get("weights")
    return keep if weights is None else keep & (weights != 0)


def coefficients(log_ratio: Tensor, trained: Tensor, correction: Correction) -> Tensor:
    """Each token's ``c(w)`` (no gradient), from ``log w = p - q``; 1 where a token is not trained.

    Args:
        log_ratio: ``[len]``, ``p - q`` of one datum.
        trained: ``[len]`` bool, its trained tokens (:func:`trained_tokens`).
        correction: the choice.
    """
    log_ratio = log_ratio.detach()
    ratio = torch.exp(log_ratio)
    if correction.token == "tis":
        coef = torch.clamp(ratio, max=correction.high)
    elif correction.token in ("mis", "icepop"):
        inside = (ratio >= correction.low) & (ratio <= correction.high)
        coef = torch.where(inside, ratio, torch.zeros_like(ratio))
    else:
        coef = ratio
    if sequence_masked(log_ratio, trained, correction):
        coef = torch.zeros_like(coef)
    return torch.where(trained, coef, torch.ones_like(coef))


def sequence_masked(log_ratio: Tensor, trained: Tensor, correction: Correction) -> bool:
    """Whether the geometric mask drops this datum: ``exp(mean(log w))`` over its trained tokens outside the band."""
    if correction.sequence is None or not bool(trained.any()):
        return False
    geometric = float(torch.exp(log_ratio.detach()[trained].double().mean()))
    low, high = correction.sequence
    return not low <= geometric <= high


def corrected_importance_sampling(logprobs: Tensor, inputs: Mapping[str, Tensor], correction: Correction) -> Tensor:
    """Per-token ``-c(w) * exp(p - stop_gradient(p)) * A`` (times ``weights`` where given)."""
    trained = trained_tokens(inputs)
    coef = coefficients(logprobs - inputs["logprobs"], trained, correction).to(logprobs.dtype)
    # exp(p - p.detach()) is 1 in value and carries grad(p): the REINFORCE form of the weighted loss.
    loss = -coef * torch.exp(logprobs - logprobs.detach()) * inputs["advantages"]
    weights = inputs.get("weights")
    return loss if weights is None else loss * weights


def weight_statistics(logprobs: Tensor, inputs: Mapping[str, Tensor], correction: Correction) -> dict[str, float]:
    """One datum's sums of the weights' statistics, over its trained tokens, as ``forward_backward`` metrics.

    Returns:
        ``offpolicy/tokens:sum`` (trained tokens), ``offpolicy/is_weight:sum``
        (of ``w``), ``offpolicy/is_weight_max:max`` (``w`` before any clamp or
        mask), ``offpolicy/corrected:sum`` (tokens whose ``c(w)`` differs from
        ``w``: clamped or masked), ``offpolicy/coef:sum`` and
        ``offpolicy/coef_sq:sum`` (of ``c(w)``, for the effective sample size),
        ``offpolicy/sequences:sum`` and ``offpolicy/sequences_masked:sum``.
    """
    trained = trained_tokens(inputs)
    log_ratio = (logprobs.detach() - inputs["logprobs"]).double()
    ratio = torch.exp(log_ratio)[trained]
    coef = coefficients(log_ratio, trained, correction)[trained]
    masked = sequence_masked(log_ratio, trained, correction)
    return {
        "offpolicy/tokens:sum": float(trained.sum()),
        "offpolicy/is_weight:sum": float(ratio.sum()),
        "offpolicy/is_weight_max:max": float(ratio.max()) if ratio.numel() else 0.0,
        "offpolicy/corrected:sum": float((coef != ratio).sum()),
        "offpolicy/coef:sum": float(coef.sum()),
        "offpolicy/coef_sq:sum": float((coef**2).sum()),
        "offpolicy/sequences:sum": float(bool(trained.any())),
        "offpolicy/sequences_masked:sum": float(masked),
    }
