"""The fake backend: a Trio-native :class:`~trio_rl.backends.protocol.Backend` in virtual time."""

from __future__ import annotations

from types import TracebackType
from typing import Self

import trio

from .clients import FakeSamplingClient, FakeTrainingClient
from .service import FakeService


class FakeBackend(FakeService):
    """A Trio-native backend with virtual latencies, for tests and benchmarks.

    By default a sample call takes ``sample_latency`` whatever it samples, and
    any number of calls run at once. Given a ``sampler`` (:class:`FakeSamplerModel`)
    with ``slots``, ``token_latency`` or ``response_length``, sampling follows a
    finite sampler model instead, as a real server behaves under a long tail of
    response lengths:

    - each response has ``response_length(prompt_tokens, sample_index)`` tokens
      (default: the random 1..``max_tokens`` of the default path), capped at the
      request's ``max_tokens``;
    - each response holds one of ``slots`` slots (default: unlimited) for
      ``length * token_latency`` seconds, after the call's ``sample_latency``;
    - when every slot is busy it queues, first come first served; responses that
      arrive at the same instant are ordered by prompt, sample index, weights
      version and seed, so the order never depends on Trio's scheduling;
    - every response is recorded in :attr:`sequences` (when ``record_calls``).

    It has in-flight weights (``check_inflight_weights``): see
    :meth:`FakeTrainingClient.save_weights_for_sampler` and :class:`FakeSamplingClient`.

    Args:
        seed: makes every sampled token reproducible.
        sample_latency: seconds per sample call, or a function of the request returning seconds.
        train_latency: seconds per ``forward_backward``, or a function of the data returning seconds.
        latencies: the latencies of ``optim_step``, ``save_weights_for_sampler`` and
            ``save_state`` (:class:`FakeLatencies`; default: none).
        sampler: the sampler model and the sampled tokens' vocabulary
            (:class:`FakeSamplerModel`; default: unlimited, tokens in ``range(32)``).
        record_calls: keep :attr:`calls` (and, with the sampler model, :attr:`sequences`).

    Attributes:
        calls: every call received, in order.
        fail_sample, fail_train: set to an exception to make those calls fail.
    """

    def check_inflight_weights(self) -> None:
        """The fake always has in-flight weights (``save_weights_for_sampler(..., inflight=True)``)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> FakeTrainingClient:
        await trio.lowlevel.checkpoint()
        return FakeTrainingClient(self)

    async def create_training_client_from_state(self, path: str, *, with_optimizer: bool = True) -> FakeTrainingClient:
        client = FakeTrainingClient(self)
        await client.load_state(path, with_optimizer=with_optimizer)
        return client

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> FakeSamplingClient:
        """A client for the initial weights (version 0), or for a saved sampler's version."""
        await trio.lowlevel.checkpoint()
        self.record("create_sampling_client", 0, base_model=base_model, model_path=model_path)
        return FakeSamplingClient(self, version=self.samplers.get(model_path or "", 0), model_path=model_path)
