"""What the fake backend's calls cost and what it records of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

Latency = float | Callable[[Any], float]
"""Seconds of virtual latency: a constant, or a function of the request."""


ResponseLength = Callable[[Sequence[int], int], int]
"""``fn(prompt_tokens, sample_index) -> int``: how many tokens one sampled response has."""


def latency_of(latency: Latency, request: Any) -> float:
    """The seconds ``latency`` gives ``request``."""
    return latency(request) if callable(latency) else latency


@dataclass(frozen=True)
class FakeCall:
    """One call the fake backend received.

    Attributes:
        kind: ``sample``, ``forward_backward``, ``optim_step``, ``save_weights_for_sampler``,
            ``save_state``, ``load_state`` or ``compute_logprobs``.
        time: ``trio.current_time()`` when it was received.
        version: the weights version it ran against.
        detail: call-specific facts (datum count, seed, ...).
    """

    kind: str
    time: float
    version: int
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class FakeLatencies:
    """The fake backend's latencies for the calls after ``forward_backward``, in virtual seconds.

    Each is a constant or a function of the request returning seconds.

    Attributes:
        optim: per ``optim_step``.
        save: per ``save_weights_for_sampler``.
        state: per ``save_state`` (None: ``save``'s).
    """

    optim: Latency = 0.0
    save: Latency = 0.0
    state: Latency | None = None

    @property
    def save_state(self) -> Latency:
        """The latency of ``save_state``."""
        return self.save if self.state is None else self.state
