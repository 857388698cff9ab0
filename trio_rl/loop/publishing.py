"""How a run publishes its weights to the samplers: snapshots, or in flight; chosen once per run.

The choice has three consequences, and this is the one place that knows them:
how each step's weights are saved for sampling, which client an evaluation of a
version gets, and whether the token lags a step records are exact or bounds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..backends.protocol import SamplingClient, TrainingClient
from ..config import Config


class WeightsPublishing(ABC):
    """How weights reach the samplers (see :func:`publishing_for`)."""

    token_lags_are_bounds: bool
    """Whether a trained token's lag is a bound rather than exact where the backend does not say
    which weights produced it (in flight, a rollout adopts newer weights while it samples)."""

    @abstractmethod
    async def publish(self, client: TrainingClient, name: str) -> SamplingClient:
        """Save ``client``'s weights for sampling as ``name``; the samplers' new client."""

    @abstractmethod
    async def pinned(self, client: TrainingClient, version: int, latest: SamplingClient) -> SamplingClient:
        """A client for exactly the weights of ``version``, the latest published (``latest``), to evaluate.

        Call it between steps, when ``client`` holds ``version``'s weights.
        """


class SnapshotWeights(WeightsPublishing):
    """Each step's weights are a snapshot: a sample runs on the weights saved when its client was created."""

    token_lags_are_bounds = False

    async def publish(self, client: TrainingClient, name: str) -> SamplingClient:
        """Save a snapshot; without an ``inflight`` argument, so a training client written before
        in-flight weights existed (a user's wrapper, a test double) still works."""
        return await client.save_weights_for_sampler(name)

    async def pinned(self, client: TrainingClient, version: int, latest: SamplingClient) -> SamplingClient:
        """``latest`` itself: a snapshot never moves."""
        return latest


class InflightWeights(WeightsPublishing):
    """Each step's weights are published in flight: running samples adopt them as they propagate."""

    token_lags_are_bounds = True

    async def publish(self, client: TrainingClient, name: str) -> SamplingClient:
        """Save mutable weights (``save_weights_for_sampler(name, inflight=True)``)."""
        return await client.save_weights_for_sampler(name, inflight=True)

    async def pinned(self, client: TrainingClient, version: int, latest: SamplingClient) -> SamplingClient:
        """A snapshot saved now: the in-flight ``latest`` would adopt the next step's weights while it samples."""
        return await client.save_weights_for_sampler(f"{version:06d}-eval")


def publishing_for(config: Config) -> WeightsPublishing:
    """The publishing ``config`` selects: in flight where ``async_config.inflight_weights``, else snapshots."""
    inflight = config.async_config is not None and config.async_config.inflight_weights
    return InflightWeights() if inflight else SnapshotWeights()
