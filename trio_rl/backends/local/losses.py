"""The Tinker service's built-in losses, per token, on torch tensors.

Each function takes the learner's logprobs of the target tokens (``[N]``, with
gradient) and the datum's ``loss_fn_inputs`` as tensors, and returns the loss of
each token (``[N]``). As on the service, a datum's loss is the SUM of its tokens'
losses (not a mean), and a batch's loss is the sum over its data; ``loss:sum``
reports that sum.

Definitions (``r = exp(logprobs - sampling_logprobs)``, ``A`` = advantages):

* ``cross_entropy``: ``-logprobs * weights``
* ``importance_sampling``: ``-r * A``, or with an off-policy correction chosen
  by ``loss_fn_config`` (``tis_cap``, ``mis_cap``, ``icepop_low``/``icepop_high``,
  ``geo_mask_low``/``geo_mask_high``) ``-c(r) * A`` with ``c(r)`` held constant
  (see :mod:`.offpolicy`)
* ``ppo``: ``-min(r * A, clip(r, low, high) * A)``
* ``cispo``: ``-stop_gradient(clip(r, low, high)) * logprobs * A``
* ``dro``: ``-(logprobs * A - beta / 2 * (logprobs - sampling_logprobs)**2)``, with
  ``beta`` from ``loss_fn_config`` (required: the service's default is not published)

``low``/``high`` are the absolute ratio bounds ``clip_low_threshold`` and
``clip_high_threshold`` of ``loss_fn_config`` (defaults 0.8 and 1.2). The RL
losses also multiply by ``weights`` when a datum has them, so that padding or
prompt positions can be masked out the same way as for ``cross_entropy``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor

from trio_rl.backends.local.offpolicy import CORRECTION_KEYS, corrected_importance_sampling, parse_correction

DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2

_RL_INPUTS = ("target_tokens", "logprobs", "advantages")
REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": _RL_INPUTS,
    "ppo": _RL_INPUTS,
    "cispo": _RL_INPUTS,
    "dro": _RL_INPUTS,
}
"""The ``loss_fn_inputs`` each supported loss needs."""

_CONFIG_KEYS: dict[str, frozenset[str]] = {
    "cross_entropy": frozenset(),
    "importance_sampling": CORRECTION_KEYS,
    "ppo": frozenset({"clip_low_threshold", "clip_high_threshold"}),
    "cispo": frozenset({"clip_low_threshold", "clip_high_threshold"}),
    "dro": frozenset({"beta"}),
}


def _clip_bounds(config: Mapping[str, float]) -> tuple[float, float]:
    low = float(config.get("clip_low_threshold", DEFAULT_CLIP_LOW))
    high = float(config.get("clip_high_threshold", DEFAULT_CLIP_HIGH))
    if not 0.0 <= low <= high:
        raise ValueError(f"need 0 <= clip_low_threshold <= clip_high_threshold, got {low}, {high}")
    return low, high


def _weighted(loss: Tensor, inputs: Mapping[str, Tensor]) -> Tensor:
    weights = inputs.get("weights")
    return loss if weights is None else loss * weights


def cross_entropy(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """Per-token negative log-likelihood times ``weights``."""
    return -logprobs * inputs["weights"]


def importance_sampling(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """Per-token importance-weighted policy gradient loss ``-r * A``, or its correction (:mod:`.offpolicy`)."""
    correction = parse_correction(config)
    if correction.active:
        return corrected_importance_sampling(logprobs, inputs, correction)
    ratio = torch.exp(logprobs - inputs["logprobs"])
    return _weighted(-ratio * inputs["advantages"], inputs)


def ppo(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """Per-token PPO clipped surrogate loss ``-min(r * A, clip(r) * A)``."""
    low, high = _clip_bounds(config)
    advantages = inputs["advantages"]
    ratio = torch.exp(logprobs - inputs["logprobs"])
    objective = torch.minimum(ratio * advantages, torch.clamp(ratio, low, high) * advantages)
    return _weighted(-objective, inputs)


def cispo(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """Per-token CISPO loss: the clipped ratio, without gradient, weights ``logprobs * A``."""
    low, high = _clip_bounds(config)
    ratio = torch.exp(logprobs - inputs["logprobs"])
    coefficient = torch.clamp(ratio, low, high).detach()
    return _weighted(-coefficient * logprobs * inputs["advantages"], inputs)


def dro(logprobs: Tensor, inputs: Mapping[str, Tensor], config: Mapping[str, float]) -> Tensor:
    """Per-token DRO loss: ``-(logprobs * A)`` plus a quadratic penalty on the log-ratio to the sampler."""
    quadratic = (logprobs - inputs["logprobs"]) ** 2
    return _weighted(-(logprobs * inputs["advantages"] - 0.5 * float(config["beta"]) * quadratic), inputs)


LOSS_FUNCTIONS: dict[str, Callable[[Tensor, Mapping[str, Tensor], Mapping[str, float]], Tensor]] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
}


def token_tis_loss() -> tuple[str, dict[str, float]]:
    """``importance_sampling`` with token-level TIS at cap 2: the in-process backends' ``AsyncConfig.loss_fn=None``.

    LocalBackend and HFBackend lack the Tinker service's
    ``stable_reinforce``. Truncated importance sampling at ``tis_cap=2.0``
    (SkyRL's default cap for token TIS) keeps the off-policy weighting of the
    cookbook's ``importance_sampling`` while bounding what one token sampled by
    much older weights can weigh (:mod:`.offpolicy`).
    """
    return "importance_sampling", {"tis_cap": 2.0}


def check_loss_fn(loss_fn: str, config: Mapping[str, float] | None, backend: str = "LocalBackend") -> None:
    """Reject an unsupported loss or a config key the loss does not read.

    Raises:
        ValueError: if ``loss_fn`` is not one of :data:`LOSS_FUNCTIONS` or
            ``config`` names a key that ``loss_fn`` does not use.
    """
    if loss_fn not in LOSS_FUNCTIONS:
        raise ValueError(
            f"{backend} does not implement loss_fn={loss_fn!r}; it trains {', '.join(sorted(LOSS_FUNCTIONS))}"
        )
    unknown = set(config or {}) - _CONFIG_KEYS[loss_fn]
    if unknown:
        raise ValueError(f"loss_fn_config keys {sorted(unknown)} are not used by {loss_fn!r}")
    if loss_fn == "dro" and "beta" not in (config or {}):
        raise ValueError("loss_fn='dro' needs loss_fn_config={'beta': ...} on LocalBackend")
    if config and loss_fn in ("ppo", "cispo"):
        _clip_bounds(config)
    if config and loss_fn == "importance_sampling":
        parse_correction(config)
