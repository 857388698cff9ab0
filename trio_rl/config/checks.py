"""The rules a configuration's values obey, each raising one ``ConfigError`` that names the field and the fix.

They know values and field names only, not the configuration classes that use
them, so every part of the configuration can use them.
"""

from __future__ import annotations

from typing import get_args

from tinker import types as tinker_types

from .. import _tinker_compat as compat
from ..errors import ConfigError

LOSS_FNS: tuple[str, ...] = tuple(name for name in get_args(tinker_types.LossFnType) if name != "custom")
"""Every loss the installed tinker SDK's ``LossFnType`` admits, except ``custom`` (a client-side
loss, which needs ``forward_backward_custom``); whether a backend trains it is its own check."""

DEFAULT_LOSS_FN = "importance_sampling"
"""``Config.loss_fn``'s default: in async mode it never conflicts with ``AsyncConfig.loss_fn``."""


def check_known_loss(field: str, loss: str) -> None:
    """Reject a loss the installed tinker SDK does not admit.

    Raises:
        ConfigError: naming ``field``, and the SDK to install where the loss is newer than it.
    """
    if loss in LOSS_FNS:
        return
    if loss == "stable_reinforce":
        raise ConfigError(
            field,
            f"'stable_reinforce' needs the tinker SDK 0.38 or later; the installed {compat.SDK_VERSION} lacks it "
            "(upgrade tinker, or choose another loss)",
        )
    raise ConfigError(field, f"unknown loss {loss!r}; use one of {', '.join(LOSS_FNS)}")


def positive(name: str, value: float, fix: str) -> None:
    """Reject ``value`` unless it is > 0 (NaN included), suggesting ``fix``."""
    if not value > 0:  # also rejects NaN
        raise ConfigError(name, f"must be > 0, got {value}; use {fix}")


def non_negative(name: str, value: float, fix: str) -> None:
    """Reject ``value`` unless it is >= 0 (NaN included), saying what ``fix`` does."""
    if not value >= 0:  # also rejects NaN
        raise ConfigError(name, f"must be >= 0, got {value} ({fix})")


def in_range(
    name: str, value: float, bounds: tuple[float, float], fix: str, *, low_open: bool = False, high_open: bool = False
) -> None:
    """Reject ``value`` outside ``bounds``, ``[low, high]`` (either end open on request; NaN rejected); ``fix`` names the range."""
    low, high = bounds
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (above and below):  # also rejects NaN
        raise ConfigError(name, f"must be in {fix}, got {value}")


def divides(name: str, value: int, divisor_name: str, divisor: int) -> None:
    """Reject ``value`` unless ``divisor`` divides it."""
    if value % divisor != 0:
        raise ConfigError(
            name, f"{value} is not divisible by {divisor_name}={divisor}; make it a multiple of {divisor}"
        )
