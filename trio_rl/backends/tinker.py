"""``TinkerBackend``: the client protocol of :mod:`trio_rl.backends.protocol` on the Tinker service.

The tinker SDK does its work on a thread of its own; this module drives it from Trio:

* Submit methods (``forward_backward``, ``optim_step``, ``save_state``,
  ``save_weights_for_sampler``, ``load_state``, ``sample``, ``compute_logprobs``) only
  hand a coroutine to the SDK's thread and return a future, in tinker 0.24.1 and 0.38
  alike, so they are called right on the Trio thread. Calls therefore reach the SDK in
  the order the pipeline makes them, and the SDK's request ids (assigned at submit)
  keep that order on the service.
* Calls that block the calling thread (creating clients, ``get_tokenizer``) run in
  ``trio.to_thread.run_sync``; the pipeline keeps running meanwhile.
* Futures are awaited with :func:`~trio_rl.backends._future_bridge.await_future`:
  no thread per wait, cancellation cancels the request, and every wait has a
  deadline (:class:`TinkerTimeouts`), because the SDK retries some server failures
  forever. A missed deadline raises :class:`RemoteTimeoutError`.
* The SDK's own exceptions reach the caller unchanged, and nothing is retried here:
  the SDK already retries what is transient.

Differences between SDK versions that matter here: in 0.24.1 the client-creation
methods block and return the client; in 0.38 they return a future of it (which is
also usable, deprecated, as the client). Both are handled by running the call in a
thread and then awaiting whatever future it returned. In 0.38 ``sample`` returns an
``APIFuture`` that is also a ``concurrent.futures.Future``; the bridge uses its
``.future()``. ``TrainingClient.load_state*`` is deprecated in 0.38 (the SDK warns on
each call); resuming should prefer :meth:`TinkerBackend.create_training_client_from_state`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Literal, Protocol, Self, TypeVar

import tinker
import trio
from tinker import types as tinker_types

from .. import _tinker_compat as compat
from ._future_bridge import RemoteTimeoutError, SDKFuture, await_future, is_sdk_future, remote_deadline
from .protocol import Tokenizer

__all__ = [
    "MissingApiKeyError",
    "RemoteTimeoutError",
    "SDKServiceClient",
    "TinkerBackend",
    "TinkerPendingResult",
    "TinkerSamplingClient",
    "TinkerTimeouts",
    "TinkerTrainingClient",
]

T = TypeVar("T")

logger = logging.getLogger(__name__)


class MissingApiKeyError(RuntimeError):
    """The Tinker API key is missing or malformed; raised before any work starts."""


@dataclasses.dataclass(frozen=True)
class TinkerTimeouts:
    """How long each kind of remote wait may take, in seconds.

    A deadline covers one wait: from the moment the caller starts waiting (for a
    training request, ``await pending.result()``) until the answer arrives. Requests
    of one training client run in order, so the wait for an ``optim_step`` includes
    the ``forward_backward`` submitted before it.

    The defaults are generous, to cover a busy service; lower them to fail faster.
    """

    create_training_client: float = 900.0
    """Creating a training client; the service may first wait for capacity."""
    forward_backward: float = 600.0
    optim_step: float = 600.0
    sample: float = 600.0
    """One ``sample`` or ``compute_logprobs`` request."""
    checkpoint: float = 600.0
    """``save_state``, ``save_weights_for_sampler``, ``load_state``, creating a sampling client."""
    tokenizer: float = 300.0
    """``get_tokenizer``, which may download the tokenizer."""
    close: float = 30.0
    """Finishing the session when the backend built its own service client."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int | float) or math.isnan(value) or value <= 0:
                raise ValueError(f"TinkerTimeouts.{field.name} must be a positive number, got {value!r}")


class SDKServiceClient(Protocol):
    """The part of ``tinker.ServiceClient`` that :class:`TinkerBackend` uses.

    Return types are ``Any`` because they differ across SDK versions: the client
    itself (0.24.1) or a future of it (0.38).
    """

    def create_lora_training_client(self, base_model: str, rank: int = ..., seed: int | None = ...) -> Any: ...

    def create_training_client_from_state(self, path: str) -> Any: ...

    def create_training_client_from_state_with_optimizer(self, path: str) -> Any: ...

    def create_sampling_client(self, model_path: str | None = ..., base_model: str | None = ...) -> Any: ...


class TinkerPendingResult(Generic[T]):
    """A submitted Tinker request; :meth:`result` waits for it (a ``PendingResult``)."""

    def __init__(self, future: SDKFuture[T], *, what: str, timeout: float, server: str | None = None) -> None:
        self._future = future
        self._what = what
        self._timeout = timeout
        self._server = server

    async def result(self) -> T:
        """Wait for the answer; a cancelled wait leaves the request in place and may be resumed.

        Returns:
            The SDK's response.

        Raises:
            RemoteTimeoutError: if no answer came within the configured timeout;
                the request is then cancelled where possible.
            Exception: the SDK's exception for this request, unchanged.
        """
        return await await_future(
            self._future, what=self._what, timeout=self._timeout, withdraw_on_cancel=False, server=self._server
        )


class _HfTokenizer:
    """The SDK's (Hugging Face) tokenizer, with ``encode`` adding no special tokens.

    The protocol's ``encode`` adds none, while Hugging Face adds e.g. a BOS token by
    default. Everything else, ``apply_chat_template`` included, is the wrapped
    tokenizer's own.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.wrapped = tokenizer

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        kwargs.setdefault("add_special_tokens", False)
        return list(self.wrapped.encode(text, **kwargs))

    def decode(self, tokens: Sequence[int], **kwargs: Any) -> str:
        return str(self.wrapped.decode(list(tokens), **kwargs))

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet: don't recurse
            raise AttributeError(name)
        return getattr(self.wrapped, name)


async def _call_blocking(fn: Callable[[], Any], *, what: str, timeout: float, server: str | None = None) -> Any:
    """Run a blocking SDK call in a thread and, if it returned a future, await that too.

    One deadline covers both parts. On expiry or cancellation the thread is abandoned:
    it cannot be interrupted, and whatever it returns later is dropped.
    """
    with remote_deadline(what, timeout, server):
        value = await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
        if is_sdk_future(value):
            value = await await_future(value, what=what, timeout=None)
        return value


class TinkerSamplingClient:
    """Samples from one fixed set of weights on the Tinker service."""

    def __init__(
        self, sdk_client: Any, *, model_path: str | None, timeouts: TinkerTimeouts, server: str | None = None
    ) -> None:
        """Wrap an SDK sampling client.

        Args:
            sdk_client: A ``tinker.SamplingClient``.
            model_path: The ``tinker://`` path of its weights, if they were saved by name.
            timeouts: Deadlines for its requests.
            server: The server's URL, named when a deadline is missed.
        """
        self._client = sdk_client
        self._model_path = model_path
        self._timeouts = timeouts
        self._server = server

    @property
    def model_path(self) -> str | None:
        """The ``tinker://`` path of the weights it samples from, if saved by name."""
        return self._model_path

    @property
    def sdk_client(self) -> Any:
        """The underlying ``tinker.SamplingClient``, for what the protocol does not cover."""
        return self._client

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
        response: tinker_types.SampleResponse = await await_future(
            future, what="sample", timeout=self._timeouts.sample, server=self._server
        )
        return response

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        """Score ``prompt``: each token's logprob given those before it (``None`` first).

        Raises:
            RemoteTimeoutError: if it took longer than ``TinkerTimeouts.sample``.
            Exception: the SDK's own errors, unchanged.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        future = self._client.compute_logprobs(prompt)
        logprobs: list[float | None] = await await_future(
            future, what="compute_logprobs", timeout=self._timeouts.sample, server=self._server
        )
        return logprobs


class TinkerTrainingClient:
    """Trainable weights and optimizer state on the Tinker service."""

    def __init__(
        self,
        sdk_client: Any,
        *,
        timeouts: TinkerTimeouts,
        server: str | None = None,
        record_stability_info: bool = False,
    ) -> None:
        """Wrap an SDK training client.

        Args:
            sdk_client: A ``tinker.TrainingClient``.
            timeouts: Deadlines for its requests.
            server: The server's URL, named when a deadline is missed.
            record_stability_info: create every sampler with ``record_stability_info=True``
                (tinker 0.38), which ``stable_reinforce`` trains on.
        """
        self._client = sdk_client
        self._timeouts = timeouts
        self._server = server
        self._record_stability_info = record_stability_info
        self._tokenizer: Tokenizer | None = None

    @property
    def sdk_client(self) -> Any:
        """The underlying ``tinker.TrainingClient``, for what the protocol does not cover."""
        return self._client

    async def forward_backward(
        self,
        data: Sequence[tinker_types.Datum],
        loss_fn: tinker_types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
    ) -> TinkerPendingResult[tinker_types.ForwardBackwardOutput]:
        """Submit a forward/backward pass; it is queued before this returns.

        Args:
            data: The batch.
            loss_fn: The loss, such as ``"importance_sampling"`` or ``"cross_entropy"``.
            loss_fn_config: Extra loss parameters, if any.

        Returns:
            The pending result; ``await pending.result()`` waits for it, with the
            ``TinkerTimeouts.forward_backward`` deadline.

        Raises:
            ValueError: for ``stable_reinforce``, a datum without provenance (checked before
                anything is sent, as tinker-cookbook 0.6.1 does).
            Exception: the SDK's own validation errors (e.g. an empty batch), unchanged.
        """
        if loss_fn in STABILITY_LOSSES:
            _check_provenance(data, loss_fn)
        # A caller that is already cancelled submits nothing. Otherwise nothing yields
        # between this call and the submit, so submits keep the callers' order.
        await trio.lowlevel.checkpoint_if_cancelled()
        future = self._client.forward_backward(list(data), loss_fn, loss_fn_config)
        return await self._submitted(future, "forward_backward", self._timeouts.forward_backward)

    async def optim_step(
        self, adam_params: tinker_types.AdamParams
    ) -> TinkerPendingResult[tinker_types.OptimStepResponse]:
        """Submit one Adam step on the accumulated gradients; it is queued before this returns.

        Returns:
            The pending result, with the ``TinkerTimeouts.optim_step`` deadline.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        # Positional: 0.24.1 names the parameter ``adam_params``, 0.38 ``optim_params``.
        future = self._client.optim_step(adam_params)
        return await self._submitted(future, "optim_step", self._timeouts.optim_step)

    async def save_weights_for_sampler(self, name: str, *, inflight: bool = False) -> TinkerSamplingClient:
        """Save the current weights under ``name`` and return a client pinned to them.

        Args:
            name: The checkpoint name (unique within the training run).

        Returns:
            A sampling client whose ``model_path`` is the saved weights' ``tinker://`` path.

        Raises:
            RemoteTimeoutError: if saving or creating the client took longer than
                ``TinkerTimeouts.checkpoint`` (each).
        """
        if inflight:
            raise ValueError(f"{type(self).__name__} has no in-flight weights yet")
        # Not save_weights_and_get_sampling_client: its weights are ephemeral and have
        # no path, and the protocol promises a ``model_path``.
        await trio.lowlevel.checkpoint_if_cancelled()
        future = self._client.save_weights_for_sampler(name)
        saved = await self._wait(future, "save_weights_for_sampler")
        path: str = saved.path
        # Only passed when set: tinker 0.24.1's create_sampling_client has no such parameter.
        record: dict[str, Any] = {"record_stability_info": True} if self._record_stability_info else {}
        sdk_sampler = await _call_blocking(
            lambda: self._client.create_sampling_client(path, **record),
            what="create_sampling_client",
            timeout=self._timeouts.checkpoint,
            server=self._server,
        )
        return TinkerSamplingClient(sdk_sampler, model_path=path, timeouts=self._timeouts, server=self._server)

    async def save_state(self, name: str) -> str:
        """Save weights and optimizer state under ``name``.

        Returns:
            The ``tinker://`` path to resume from.

        Raises:
            RemoteTimeoutError: if it took longer than ``TinkerTimeouts.checkpoint``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        future = self._client.save_state(name)
        saved = await self._wait(future, "save_state")
        path: str = saved.path
        return path

    async def load_state(self, path: str, *, with_optimizer: bool = True) -> None:
        """Load weights (and, if asked, optimizer state) saved by :meth:`save_state`.

        tinker 0.38 deprecates loading into an existing client and warns on each call;
        prefer :meth:`TinkerBackend.create_training_client_from_state`.

        Raises:
            RemoteTimeoutError: if it took longer than ``TinkerTimeouts.checkpoint``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        future = self._client.load_state_with_optimizer(path) if with_optimizer else self._client.load_state(path)
        await self._wait(future, "load_state")

    async def get_tokenizer(self) -> Tokenizer:
        """The tokenizer of the model being trained (loaded once, in a thread).

        Its ``encode`` adds no special tokens unless asked (``add_special_tokens=True``).

        Raises:
            RemoteTimeoutError: if loading took longer than ``TinkerTimeouts.tokenizer``.
        """
        if self._tokenizer is None:
            tokenizer = await _call_blocking(
                self._client.get_tokenizer, what="get_tokenizer", timeout=self._timeouts.tokenizer, server=self._server
            )
            self._tokenizer = _HfTokenizer(tokenizer)
        return self._tokenizer

    async def _submitted(self, future: SDKFuture[T], what: str, timeout: float) -> TinkerPendingResult[T]:
        # The request is already queued. Yield to the scheduler as an async function
        # should, but without a cancellation point: a Cancelled raised here would lose
        # the handle of a request that runs anyway.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return TinkerPendingResult(future, what=what, timeout=timeout, server=self._server)

    async def _wait(self, future: SDKFuture[Any], what: str) -> Any:
        """A checkpoint request's answer, within ``TinkerTimeouts.checkpoint``."""
        return await await_future(future, what=what, timeout=self._timeouts.checkpoint, server=self._server)


class TinkerBackend:
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
        self.record_stability_info = False
        """Whether the training clients made from now on create samplers that record stability info;
        :meth:`check_loss_fn` sets it for ``stable_reinforce``."""
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
        sdk_sampler = await _call_blocking(
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
        sdk_client = await _call_blocking(create, what=what, timeout=timeout, server=self._server)
        return TinkerTrainingClient(
            sdk_client, timeouts=self.timeouts, server=self._server, record_stability_info=self.record_stability_info
        )


STABILITY_LOSSES = frozenset({"stable_reinforce"})
"""Losses that train on what samplers recorded about each sequence, found through the Datum's provenance."""


def _check_provenance(data: Sequence[tinker_types.Datum], loss_fn: str) -> None:
    for index, datum in enumerate(data):
        if getattr(datum, "loss_fn_input_spans", None) is None:
            raise ValueError(
                f"loss_fn={loss_fn!r} needs provenance on every datum, and datum {index} has none: one of its "
                "actions lacks a sequence_id (TokensWithLogprobs.sequence_id, which a custom sampler must set) "
                "or none of its targets is a sampled token; fix the data or train with another loss"
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
            await _call_blocking(lambda: close(status), what="ServiceClient.close", timeout=timeout)
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
