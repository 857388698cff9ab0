"""Evaluators: what the evaluator stage runs on a set of weights."""

from __future__ import annotations

from typing import Protocol

from .backends.protocol import SamplingClient


class SamplingClientEvaluator(Protocol):
    """Scores the weights behind a sampling client, as in tinker-cookbook.

    The returned metrics are logged under the step whose weights were evaluated.
    """

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]: ...
