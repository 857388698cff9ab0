"""Adam with decoupled weight decay, driven by ``tinker.types.AdamParams`` each step.

Implemented here rather than with ``torch.optim.AdamW`` so that every step can
take its own hyperparameters (as a Tinker ``optim_step`` does), and so that the
state is a plain ``step`` count plus two tensors per parameter, which saves to
safetensors and restores bit for bit.

One step, per parameter ``p`` with gradient ``g`` (after global-norm clipping)::

    p  *= 1 - lr * weight_decay          # decoupled (AdamW) decay, as Tinker documents
    m   = beta1 * m + (1 - beta1) * g
    v   = beta2 * v + (1 - beta2) * g**2
    p  -= lr / (1 - beta1**t) * m / (sqrt(v / (1 - beta2**t)) + eps)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from tinker import types as tinker_types
from torch import Tensor, nn


@dataclass
class AdamState:
    """Step count and first/second moment estimates, keyed by parameter name."""

    step: int = 0
    exp_avg: dict[str, Tensor] = field(default_factory=dict)
    exp_avg_sq: dict[str, Tensor] = field(default_factory=dict)


def adam_step(model: nn.Module, state: AdamState, params: tinker_types.AdamParams) -> dict[str, float]:
    """Apply one Adam step with the accumulated gradients, then clear them.

    A parameter without a gradient counts as a zero gradient, so every moment
    advances with the shared step count.

    Args:
        model: the module whose ``.grad`` fields hold the accumulated gradients.
        state: updated in place.
        params: learning rate, betas, eps, weight decay and ``grad_clip_norm``
            (``0`` disables clipping).

    Returns:
        Metrics: ``grad_norm`` (before clipping) and ``learning_rate``.
    """
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    grads = {name: (p.grad if p.grad is not None else torch.zeros_like(p)) for name, p in named}
    grad_norm = math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads.values()))
    clip = float(params.grad_clip_norm)
    scale = clip / (grad_norm + 1e-6) if clip > 0 and grad_norm > clip else 1.0
    lr, b1, b2 = float(params.learning_rate), float(params.beta1), float(params.beta2)
    eps, wd = float(params.eps), float(params.weight_decay)
    state.step += 1
    bias1 = 1 - b1**state.step
    bias2 = 1 - b2**state.step
    with torch.no_grad():
        for name, p in named:
            g = grads[name] * scale if scale != 1.0 else grads[name]
            m = state.exp_avg.setdefault(name, torch.zeros_like(p))
            v = state.exp_avg_sq.setdefault(name, torch.zeros_like(p))
            if wd:
                p.mul_(1 - lr * wd)
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            denom = (v / bias2).sqrt_().add_(eps)
            p.addcdiv_(m, denom, value=-lr / bias1)
            p.grad = None
    return {"grad_norm": grad_norm, "learning_rate": lr}
