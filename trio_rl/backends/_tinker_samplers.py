"""Tinker's sampling clients, and turning a training client's weights into them: snapshot or in-flight.

tinker 0.38's sampler kinds (``tinker/types/sampling_client_kind.py``):

* ``snapshot``: fixed weights. trio_rl saves them by name (``save_weights_for_sampler``),
  so the client has a ``tinker://`` path a checkpoint can record.
* ``inflight``: ``save_weights_and_get_sampling_client(kind="inflight")`` updates one
  mutable weights target per training client, shared by all its in-flight clients,
  those returned earlier too. A sample on such a client runs on the weights saved when
  the client was created or newer; running generations adopt newer weights as they
  reach the serving replicas, keeping their KV cache. The save is ephemeral (no name,
  no path), and responses do not say which weights produced which token, so these
  clients return plain ``SampledSequence`` objects and the loop records the lag as a bound.
"""

from __future__ import annotations

from typing import Any

import tinker
import trio
from tinker import types as tinker_types

from .. import _tinker_compat as compat
from ..errors import ConfigError
from ._tinker_requests import SDKClientWrapper, TinkerTimeouts

STABILITY_LOSSES = frozenset({"stable_reinforce"})
"""Losses that train on what samplers recorded about each sequence, found through the Datum's provenance."""


class InflightWeightsRefusedError(ConfigError):
    """The Tinker server refused to save in-flight weights; the run fails before any rollout.

    A :class:`~trio_rl.ConfigError` of ``async_config.inflight_weights``: the run's first
    publish is such a save, and it comes before any rollout.

    Attributes:
        reply: the server's answer, as the SDK raised it.
    """

    def __init__(self, server: str | None, reply: Exception) -> None:
        where = f" at {server}" if server else ""
        super().__init__(
            "async_config.inflight_weights",
            f"the Tinker server{where} refused to save in-flight weights "
            f"(save_weights_and_get_sampling_client(kind='inflight')) and replied {type(reply).__name__}: {reply}; "
            "run without AsyncConfig.inflight_weights (--inflight-weights), or on a server that serves them",
        )
        self.reply = reply


def check_inflight_sdk() -> None:
    """Refuse in-flight weights where the installed SDK cannot ask for them.

    Raises:
        ValueError: on an SDK without ``kind`` (before 0.38), naming its version.
    """
    if not compat.HAS_INFLIGHT_WEIGHTS:
        raise ValueError(
            f"TinkerBackend has no in-flight weights with {compat.SDK_VERSION}: they need tinker 0.38 or later "
            "(save_weights_and_get_sampling_client(kind='inflight')); upgrade tinker or run without "
            "AsyncConfig.inflight_weights"
        )


class TinkerSamplingClient(SDKClientWrapper):
    """Samples on the Tinker service: from one fixed set of weights, or from a training client's in-flight weights."""

    def __init__(
        self, sdk_client: Any, *, model_path: str | None, timeouts: TinkerTimeouts, server: str | None = None
    ) -> None:
        """Wrap an SDK sampling client.

        Args:
            sdk_client: A ``tinker.SamplingClient``.
            model_path: The ``tinker://`` path of its weights, if they were saved by name
                (``None`` for in-flight weights, which have no path).
            timeouts: Deadlines for its requests.
            server: The server's URL, named when a deadline is missed.
        """
        super().__init__(sdk_client, timeouts=timeouts, server=server)
        self._model_path = model_path

    @property
    def model_path(self) -> str | None:
        """The ``tinker://`` path of the weights it samples from, if saved by name."""
        return self._model_path

    async def sample(
        self,
        prompt: tinker_types.ModelInput,
        num_samples: int,
        sampling_params: tinker_types.SamplingParams,
    ) -> tinker_types.SampleResponse:
        """Sample ``num_samples`` continuations of ``prompt``, with per-token logprobs.

        Args:
            prompt: The prompt tokens.
            num_samples: How many continuations.
            sampling_params: Temperature, max tokens, stop sequences, seed.

        Returns:
            The service's response.

        Raises:
            RemoteTimeoutError: if it took longer than ``TinkerTimeouts.sample``.
            Exception: the SDK's own errors, unchanged.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        future = self._client.sample(prompt, num_samples, sampling_params)
        response: tinker_types.SampleResponse = await self._wait(future, "sample", self._timeouts.sample)
        return response

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        """Score ``prompt``: each token's logprob given those before it (``None`` first).

        Raises:
            RemoteTimeoutError: if it took longer than ``TinkerTimeouts.sample``.
            Exception: the SDK's own errors, unchanged.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        future = self._client.compute_logprobs(prompt)
        logprobs: list[float | None] = await self._wait(future, "compute_logprobs", self._timeouts.sample)
        return logprobs


class SamplerSaves(SDKClientWrapper):
    """Saves a ``tinker.TrainingClient``'s weights for sampling and returns a client for them."""

    def __init__(
        self, sdk_client: Any, *, timeouts: TinkerTimeouts, server: str | None, record_stability_info: bool
    ) -> None:
        super().__init__(sdk_client, timeouts=timeouts, server=server)
        # Only passed when set: tinker 0.24.1's creation methods have no such parameter.
        self._record: dict[str, Any] = {"record_stability_info": True} if record_stability_info else {}

    async def snapshot(self, name: str) -> TinkerSamplingClient:
        """Save the weights as ``name`` and return a client pinned to them, with their path."""
        # Not save_weights_and_get_sampling_client: its weights are ephemeral and have
        # no path, while a snapshot's path goes into the checkpoint record.
        await trio.lowlevel.checkpoint_if_cancelled()
        future = self._client.save_weights_for_sampler(name)
        saved = await self._wait(future, "save_weights_for_sampler", self._timeouts.checkpoint)
        path: str = saved.path
        sdk_sampler = await self._blocking(
            lambda: self._client.create_sampling_client(path, **self._record),
            "create_sampling_client",
            self._timeouts.checkpoint,
        )
        return TinkerSamplingClient(sdk_sampler, model_path=path, timeouts=self._timeouts, server=self._server)

    async def inflight(self) -> TinkerSamplingClient:
        """Make the weights the training client's in-flight weights; return a new in-flight client.

        Raises:
            ValueError: on an SDK without in-flight weights (before 0.38); nothing is sent.
            InflightWeightsRefusedError: if the server refused the save.
        """
        check_inflight_sdk()
        await trio.lowlevel.checkpoint_if_cancelled()
        # Called on this thread, as the training requests are: 0.38 takes the request id
        # here and returns a future at once, so the save follows the optim_step submitted
        # before it. No name: 0.38 ignores it (deprecated), in-flight saves are ephemeral.
        future = self._client.save_weights_and_get_sampling_client(kind="inflight", **self._record)
        what = "save_weights_and_get_sampling_client(kind='inflight')"
        try:
            sdk_sampler = await self._wait(future, what, self._timeouts.checkpoint)
        except (tinker.APIStatusError, tinker.RequestFailedError) as error:
            # A 5xx is the SDK's to retry, not a refusal of the kind.
            if getattr(error, "status_code", 400) >= 500:
                raise
            raise InflightWeightsRefusedError(self._server, error) from error
        return TinkerSamplingClient(sdk_sampler, model_path=None, timeouts=self._timeouts, server=self._server)


class SamplerChecks:
    """A :class:`TinkerBackend`'s checks, before any work, of what the installed SDK's samplers can do."""

    record_stability_info: bool = False
    """Whether the training clients made from now on create samplers that record stability info;
    :meth:`check_loss_fn` sets it for ``stable_reinforce``."""

    def check_loss_fn(self, loss_fn: str, loss_fn_config: dict[str, float] | None) -> None:
        """Refuse, before any work, a loss the installed SDK cannot train, and prepare for the run's loss.

        The service trains every loss the SDK names. ``stable_reinforce`` also needs the
        tinker SDK 0.38 (samplers created with ``record_stability_info=True``, provenance
        on every Datum); for it, the training clients created afterwards make samplers
        that record stability info, as tinker-cookbook 0.6.1 does.

        Raises:
            ValueError: ``stable_reinforce`` on an SDK without it (0.24.1), naming the fix.
        """
        del loss_fn_config
        if loss_fn not in STABILITY_LOSSES:
            return
        if not compat.HAS_STABLE_REINFORCE:
            raise ValueError(
                f"TinkerBackend cannot train loss_fn={loss_fn!r} with {compat.SDK_VERSION}: it needs tinker 0.38 or "
                "later (samplers created with record_stability_info=True, provenance on every Datum); "
                "upgrade tinker or choose another loss"
            )
        self.record_stability_info = True

    def check_inflight_weights(self) -> None:
        """Refuse in-flight weights, before any work, where the installed SDK has none.

        Tinker's in-flight weights are ``save_weights_and_get_sampling_client(kind="inflight")``,
        from tinker 0.38. Whether the server serves them shows at the run's first publish,
        which comes before any rollout (:class:`InflightWeightsRefusedError`).

        Raises:
            ValueError: on an SDK without them (0.24.1), naming its version.
        """
        check_inflight_sdk()
