"""``TinkerBackend``: the client protocol of :mod:`trio_rl.backends.protocol` on the Tinker service.

The tinker SDK does its work on a thread of its own; this module drives it from Trio:

* Submit methods (``forward_backward``, ``optim_step``, ``save_state``,
  ``save_weights_for_sampler``, ``load_state``, ``sample``, ``compute_logprobs``) only
  hand a coroutine to the SDK's thread and return a future, in tinker 0.24.1 and 0.38
  alike, so they are called right on the Trio thread. Calls therefore reach the SDK in
  the order the pipeline makes them, and the SDK's request ids (assigned at submit)
  keep that order on the service. So is 0.38's
  ``save_weights_and_get_sampling_client(kind="inflight")``, which returns a future of
  the client at once (:mod:`._tinker_samplers`).
* Calls that block the calling thread (creating clients, ``get_tokenizer``) run in
  ``trio.to_thread.run_sync``; the pipeline keeps running meanwhile.
* Futures are awaited with :func:`~trio_rl.backends._future_bridge.await_future`:
  no thread per wait, cancellation cancels the request, and every wait has a
  deadline (:class:`TinkerTimeouts`), because the SDK retries some server failures
  forever. A missed deadline raises :class:`RemoteTimeoutError`.
* The SDK's own exceptions reach the caller unchanged, and nothing is retried here:
  the SDK already retries what is transient. One exception: a server that refuses
  in-flight weights raises :class:`InflightWeightsRefusedError`, which names the
  server's reply and the setting to change.

Differences between SDK versions that matter here: in 0.24.1 the client-creation
methods block and return the client; in 0.38 they return a future of it (which is
also usable, deprecated, as the client). Both are handled by running the call in a
thread and then awaiting whatever future it returned. In 0.38 ``sample`` returns an
``APIFuture`` that is also a ``concurrent.futures.Future``; the bridge uses its
``.future()``. ``TrainingClient.load_state*`` is deprecated in 0.38 (the SDK warns on
each call); resuming should prefer :meth:`TinkerBackend.create_training_client_from_state`.
In-flight weights need 0.38 (``kind``); 0.24.1 has none.

The clients live in :mod:`._tinker_training` and :mod:`._tinker_samplers`, the request
plumbing they share in :mod:`._tinker_requests`; their public names are importable from here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, Self

import tinker
import trio

from ._future_bridge import RemoteTimeoutError
from ._tinker_requests import TinkerPendingResult, TinkerTimeouts, call_blocking
from ._tinker_samplers import InflightWeightsRefusedError, SamplerChecks, TinkerSamplingClient
from ._tinker_training import TinkerTrainingClient

__all__ = [
    "InflightWeightsRefusedError",
    "MissingApiKeyError",
    "RemoteTimeoutError",
    "SDKServiceClient",
    "TinkerBackend",
    "TinkerPendingResult",
    "TinkerSamplingClient",
    "TinkerTimeouts",
    "TinkerTrainingClient",
]

logger = logging.getLogger(__name__)


class MissingApiKeyError(RuntimeError):
    """The Tinker API key is missing or malformed; raised before any work starts."""


class SDKServiceClient(Protocol):
    """The part of ``tinker.ServiceClient`` that :class:`TinkerBackend` uses.

    Return types are ``Any`` because they differ across SDK versions: the client
    itself (0.24.1) or a future of it (0.38).
    """

    def create_lora_training_client(self, base_model: str, rank: int = ..., seed: int | None = ...) -> Any: ...

    def create_training_client_from_state(self, path: str) -> Any: ...

    def create_training_client_from_state_with_optimizer(self, path: str) -> Any: ...

    def create_sampling_client(self, model_path: str | None = ..., base_model: str | None = ...) -> Any: ...


class TinkerBackend(SamplerChecks):
    """The Tinker service as a trio_rl backend. Enter it with ``async with`` before use.

    Example::

        async with TinkerBackend() as backend:  # TINKER_API_KEY from the environment
            client = await backend.create_training_client(base_model="Qwen/Qwen3-8B")
    """

    def __init__(
        self,
        *,
        service_client: SDKServiceClient | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        timeouts: TinkerTimeouts | None = None,
    ) -> None:
        """Configure the backend; nothing is contacted until it is used.

        Args:
            service_client: An existing ``tinker.ServiceClient`` (or a stand-in for one).
                The caller keeps ownership: it is not closed on exit, and its credentials
                are its own business.
            base_url: The service URL, when building our own client. Default: the SDK's
                (``TINKER_BASE_URL``, then the production service).
            api_key: The API key, when building our own client. Default: ``TINKER_API_KEY``.
            timeouts: Deadlines for remote calls; see :class:`TinkerTimeouts`.

        Raises:
            ValueError: if ``service_client`` is combined with ``base_url`` or ``api_key``.
        """
        if service_client is not None and (base_url is not None or api_key is not None):
            raise ValueError("pass either service_client or base_url/api_key, not both")
        self._service = service_client
        self._owns_service = service_client is None
        self._base_url = base_url
        self._api_key = api_key
        self.timeouts = timeouts or TinkerTimeouts()
        # The server named when a deadline is missed; unknown behind a client we were given.
        self._server = (base_url or os.environ.get("TINKER_BASE_URL")) if service_client is None else None

    @property
    def service_client(self) -> SDKServiceClient:
        """The ``tinker.ServiceClient`` in use.

        Raises:
            RuntimeError: if the backend was not entered and was given no client.
        """
        if self._service is None:
            raise RuntimeError("enter the TinkerBackend (async with) before using it")
        return self._service

    async def __aenter__(self) -> Self:
        """Check the credentials and build the service client (no network I/O yet).

        Raises:
            MissingApiKeyError: if no usable API key is configured.
        """
        if self._service is None:
            _check_credentials(self._api_key)
            # Only what was given: the SDK's own defaults (its env vars) apply otherwise.
            given: dict[str, Any] = {"base_url": self._base_url, "api_key": self._api_key}
            self._service = tinker.ServiceClient(**{k: v for k, v in given.items() if v is not None})
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Finish the session of a service client this backend built (0.38 only)."""
        if self._owns_service and self._service is not None:
            service, self._service = self._service, None
            await _close_session(service, exc_type, self.timeouts.close)

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> TinkerTrainingClient:
        """Create a LoRA training client for ``base_model``.

        Args:
            base_model: The model name, e.g. ``"Qwen/Qwen3-8B"``.
            lora_rank: The LoRA rank.
            seed: Seed for the LoRA initialisation; ``None`` lets the service choose.

        Returns:
            The training client.

        Raises:
            RemoteTimeoutError: if it took longer than ``TinkerTimeouts.create_training_client``.
            Exception: the SDK's own errors, unchanged.
        """
        service = self.service_client
        return await self._training_client(
            lambda: service.create_lora_training_client(base_model=base_model, rank=lora_rank, seed=seed),
            "create_lora_training_client",
        )

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> TinkerSamplingClient:
        """A sampling client for ``base_model`` (or the weights at ``model_path``), made in a thread.

        Raises:
            RemoteTimeoutError: if it took longer than ``TinkerTimeouts.checkpoint``.
            Exception: the SDK's own errors, unchanged.
        """
        service = self.service_client
        sdk_sampler = await call_blocking(
            lambda: service.create_sampling_client(model_path=model_path, base_model=base_model),
            what="create_sampling_client",
            timeout=self.timeouts.checkpoint,
            server=self._server,
        )
        return TinkerSamplingClient(sdk_sampler, model_path=model_path, timeouts=self.timeouts, server=self._server)

    async def create_training_client_from_state(
        self, path: str, *, with_optimizer: bool = True
    ) -> TinkerTrainingClient:
        """Create a training client from a path returned by ``save_state``, to resume.

        Args:
            path: The ``tinker://`` path.
            with_optimizer: Also restore the optimizer state (Adam moments).

        Returns:
            The training client.

        Raises:
            RemoteTimeoutError: if it took longer than ``TinkerTimeouts.create_training_client``.
            Exception: the SDK's own errors, unchanged.
        """
        name = "create_training_client_from_state" + ("_with_optimizer" if with_optimizer else "")
        create = getattr(self.service_client, name)
        return await self._training_client(lambda: create(path), name)

    async def _training_client(self, create: Callable[[], Any], what: str) -> TinkerTrainingClient:
        timeout = self.timeouts.create_training_client
        sdk_client = await call_blocking(create, what=what, timeout=timeout, server=self._server)
        return TinkerTrainingClient(
            sdk_client, timeouts=self.timeouts, server=self._server, record_stability_info=self.record_stability_info
        )


async def _close_session(service: SDKServiceClient, exc_type: type[BaseException] | None, timeout: float) -> None:
    """``service.close(status)`` where the SDK has it (0.38; 0.24.1 has none)."""
    close = getattr(service, "close", None)
    if close is None:
        return
    status: Literal["success", "errored", "interrupted"]
    if exc_type is None:
        status = "success"
    elif issubclass(exc_type, Exception):
        status = "errored"
    else:
        status = "interrupted"
    # Shielded so that a cancelled run still finishes its session, bounded so
    # that an unreachable service cannot hang the exit. A failure is only logged:
    # raising here would hide the error the run is exiting with, if any.
    with trio.CancelScope(shield=True):
        try:
            await call_blocking(lambda: close(status), what="ServiceClient.close", timeout=timeout)
        except Exception as error:
            logger.warning("could not finish the Tinker session: %s", error)


def _check_credentials(api_key: str | None) -> None:
    """Fail in one line, before any work, where the SDK would fail at its first request.

    The SDK accepts, in order: an explicit key, ``TINKER_API_KEY``, a
    ``TINKER_CREDENTIAL_CMD`` that prints one, and (0.38) a key stored by
    ``tinker auth login``.
    """
    key = api_key or os.environ.get("TINKER_API_KEY")
    if os.environ.get("TINKER_CREDENTIAL_CMD"):
        return
    if key:
        # "eyJ" starts a JWT, which the SDK also accepts as a key.
        if not key.startswith(("tml-", "eyJ")):
            raise MissingApiKeyError(
                "TinkerBackend: the Tinker API key must start with 'tml-'; check TINKER_API_KEY or the api_key argument"
            )
        return
    if _has_stored_credentials():
        return
    raise MissingApiKeyError(
        "TinkerBackend: no Tinker API key; set TINKER_API_KEY (it starts with 'tml-') "
        "or pass TinkerBackend(api_key=...)"
    )


def _has_stored_credentials() -> bool:
    # Keys stored by `tinker auth login`: only SDKs that ship the credentials module
    # (0.38, not 0.24.1) read them.
    import importlib.util

    if importlib.util.find_spec("tinker.lib.credentials") is None:
        return False
    return (Path.home() / ".tinker" / "credentials.json").is_file()
