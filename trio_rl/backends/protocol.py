"""The client protocol that every backend speaks, typed with ``tinker.types``.

The pipeline only ever talks to these protocols (a backend, its training and
sampling clients, their pending results, a tokenizer), so the same training loop
runs on :class:`~trio_rl.testing.FakeBackend` (virtual time), ``LocalBackend`` and
``HFBackend`` (torch in-process) and ``TinkerBackend`` (the Tinker service or a
Tinker-compatible server).

Training calls are split into *submit* and *wait*, as on the Tinker service:
``await client.forward_backward(...)`` submits the request and returns a
:class:`PendingResult` at once; ``await pending.result()`` waits for it. Requests
of one training client are processed in the order they were submitted, so the
pipeline submits ``forward_backward`` and ``optim_step`` back to back and only
then waits for both.

Backends are async context managers. Enter one (``async with backend:``) around
everything that uses it; a backend that needs background tasks (``LocalBackend``
batches concurrent sampling requests) runs them in a nursery that lives exactly
as long as that block.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Protocol, Self, TypeVar, runtime_checkable

from tinker import types as tinker_types

from .._tinker_compat import VersionedSequence

__all__ = [
    "Backend",
    "PendingResult",
    "SamplingClient",
    "Tokenizer",
    "TrainingClient",
    "VersionedSequence",
    "check_inflight_before_work",
    "check_loss_before_work",
    "token_versions",
]

T_co = TypeVar("T_co", covariant=True)


@runtime_checkable
class Tokenizer(Protocol):
    """The part of a tokenizer that envs and examples use."""

    def encode(self, text: str) -> list[int]:
        """Turn text into token ids (no special tokens added)."""
        ...

    def decode(self, tokens: Sequence[int]) -> str:
        """Turn token ids back into text."""
        ...


class PendingResult(Protocol[T_co]):
    """A submitted request; :meth:`result` waits for its answer."""

    async def result(self) -> T_co:
        """Wait for the answer. Cancelling the wait cancels the request where possible.

        Raises:
            Exception: whatever the backend raised for this request.
        """
        ...


def token_versions(sequence: tinker_types.SampledSequence) -> list[int] | None:
    """The per-token weights versions of ``sequence``, or ``None`` where its backend does not say."""
    versions = getattr(sequence, "token_versions", None)
    return None if versions is None else list(versions)


class SamplingClient(Protocol):
    """Samples from the weights it was created from, or newer ones if it is in-flight.

    A snapshot sampling client (the default) is pinned to the weights it was
    created from: later optimizer steps on the training client never change what
    it samples. An in-flight one (``save_weights_for_sampler(..., inflight=True)``)
    starts every request on those weights or newer, and a running request adopts
    weights published later between tokens.
    """

    @property
    def model_path(self) -> str | None:
        """Where the weights it samples from were saved, if they were saved by name."""
        ...

    async def sample(
        self,
        prompt: tinker_types.ModelInput,
        num_samples: int,
        sampling_params: tinker_types.SamplingParams,
    ) -> tinker_types.SampleResponse:
        """Sample ``num_samples`` continuations of ``prompt``, with per-token logprobs."""
        ...

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        """Score ``prompt``: the logprob of each token given those before it (``None`` first)."""
        ...


class TrainingClient(Protocol):
    """Holds trainable weights and their optimizer state."""

    async def forward_backward(
        self,
        data: Sequence[tinker_types.Datum],
        loss_fn: tinker_types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
    ) -> PendingResult[tinker_types.ForwardBackwardOutput]:
        """Submit a forward/backward pass that accumulates gradients."""
        ...

    async def optim_step(self, adam_params: tinker_types.AdamParams) -> PendingResult[tinker_types.OptimStepResponse]:
        """Submit one Adam step on the accumulated gradients, then clear them."""
        ...

    async def save_weights_for_sampler(self, name: str, *, inflight: bool = False) -> SamplingClient:
        """Save the current weights under ``name`` and return a sampling client for them.

        Args:
            name: what to save them as.
            inflight: ``False`` (default): the client is pinned to these weights.
                ``True``: they also become this training client's in-flight
                weights: every in-flight client of it, including those already
                returned and their running requests, samples from them from the
                next token on (Tinker's ``kind="inflight"``). Only backends with
                ``check_inflight_weights`` accept it.
        """
        ...

    async def save_state(self, name: str) -> str:
        """Save weights and optimizer state; return the path to resume from."""
        ...

    async def load_state(self, path: str, *, with_optimizer: bool = True) -> None:
        """Load weights (and, if asked, optimizer state) saved by :meth:`save_state`."""
        ...

    async def get_tokenizer(self) -> Tokenizer:
        """The tokenizer of the model being trained."""
        ...


class Backend(Protocol):
    """Creates training clients. Enter it with ``async with`` before use."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None: ...

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> TrainingClient:
        """Create a fresh training client for ``base_model``."""
        ...

    async def create_training_client_from_state(self, path: str, *, with_optimizer: bool = True) -> TrainingClient:
        """Create a training client from a path returned by ``save_state``, to resume."""
        ...

    # Optionally, a backend also has ``check_loss_fn(loss_fn, loss_fn_config)``,
    # raising ValueError for a loss it cannot train (naming those it can);
    # trio_rl.train calls it before any work with the loss the run trains
    # (``Config.training_loss_fn()``), so a backend may also prepare for that
    # loss there: TinkerBackend makes its samplers record stability info for
    # stable_reinforce (see :func:`check_loss_before_work`).

    async def create_sampling_client(self, *, base_model: str, model_path: str | None = None) -> SamplingClient:
        """A sampling client for ``base_model``'s own weights, or for the weights saved at ``model_path``.

        The KL penalty's reference model (``Config.kl_reference_config``) comes from here.
        """
        ...


def check_inflight_before_work(backend: object) -> None:
    """Fail before any work unless ``backend`` offers in-flight weights (its ``check_inflight_weights``).

    Raises:
        ValueError: the backend's reason, or that it has no in-flight weights at all.
    """
    check = getattr(backend, "check_inflight_weights", None)
    if check is None:
        raise ValueError(
            f"{type(backend).__name__} has no in-flight weights (AsyncConfig.inflight_weights); "
            "FakeBackend, LocalBackend, HFBackend and TinkerBackend (tinker 0.38 or newer) have them"
        )
    check()


def check_loss_before_work(backend: object, loss_fn: str, loss_fn_config: dict[str, float] | None) -> None:
    """Ask ``backend`` whether it can train ``loss_fn``, where it says (``check_loss_fn``).

    Raises:
        ValueError: the backend's reason, naming the backends that do support the loss.
    """
    check = getattr(backend, "check_loss_fn", None)
    if check is None:
        return
    try:
        check(loss_fn, loss_fn_config)
    except ValueError as error:
        if "TinkerBackend" in str(error):
            raise
        raise ValueError(
            f"{error} ({type(backend).__name__}); TinkerBackend passes every loss the tinker SDK admits to the "
            "service (stable_reinforce from tinker 0.38)"
        ) from None
