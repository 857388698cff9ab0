"""``TinkerTrainingClient``: trainable weights and optimizer state on the Tinker service."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import trio
from tinker import types as tinker_types

from ._future_bridge import SDKFuture
from ._tinker_requests import SDKClientWrapper, TinkerPendingResult, TinkerTimeouts
from ._tinker_samplers import STABILITY_LOSSES, SamplerSaves, TinkerSamplingClient
from .protocol import Tokenizer

T = TypeVar("T")


class TinkerTrainingClient(SDKClientWrapper):
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
        super().__init__(sdk_client, timeouts=timeouts, server=server)
        self._samplers = SamplerSaves(
            sdk_client, timeouts=timeouts, server=server, record_stability_info=record_stability_info
        )
        self._tokenizer: Tokenizer | None = None

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
        """Save the current weights and return a sampling client for them.

        Args:
            name: The checkpoint name (unique within the training run); an in-flight
                save has none on the service (its weights are ephemeral).
            inflight: ``False``: a snapshot saved as ``name``, whose client is pinned to it.
                ``True``: tinker 0.38's ``kind="inflight"``: the weights become this training
                client's in-flight weights, which all its in-flight clients (earlier ones
                too) and their running samples adopt.

        Returns:
            A sampling client; its ``model_path`` is the snapshot's ``tinker://`` path, or
            ``None`` for in-flight weights.

        Raises:
            ValueError: ``inflight=True`` on an SDK without in-flight weights (before 0.38).
            InflightWeightsRefusedError: if the server refused the in-flight save.
            RemoteTimeoutError: if saving or creating the client took longer than
                ``TinkerTimeouts.checkpoint`` (each).
        """
        return await (self._samplers.inflight() if inflight else self._samplers.snapshot(name))

    async def save_state(self, name: str) -> str:
        """Save weights and optimizer state under ``name``.

        Returns:
            The ``tinker://`` path to resume from.

        Raises:
            RemoteTimeoutError: if it took longer than ``TinkerTimeouts.checkpoint``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        future = self._client.save_state(name)
        saved = await self._wait(future, "save_state", self._timeouts.checkpoint)
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
        await self._wait(future, "load_state", self._timeouts.checkpoint)

    async def get_tokenizer(self) -> Tokenizer:
        """The tokenizer of the model being trained (loaded once, in a thread).

        Its ``encode`` adds no special tokens unless asked (``add_special_tokens=True``).

        Raises:
            RemoteTimeoutError: if loading took longer than ``TinkerTimeouts.tokenizer``.
        """
        if self._tokenizer is None:
            tokenizer = await self._blocking(self._client.get_tokenizer, "get_tokenizer", self._timeouts.tokenizer)
            self._tokenizer = _HfTokenizer(tokenizer)
        return self._tokenizer

    async def _submitted(self, future: SDKFuture[T], what: str, timeout: float) -> TinkerPendingResult[T]:
        # The request is already queued. Yield to the scheduler as an async function
        # should, but without a cancellation point: a Cancelled raised here would lose
        # the handle of a request that runs anyway.
        await trio.lowlevel.cancel_shielded_checkpoint()
        return TinkerPendingResult(future, what=what, timeout=timeout, server=self._server)


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


def _check_provenance(data: Sequence[tinker_types.Datum], loss_fn: str) -> None:
    for index, datum in enumerate(data):
        if getattr(datum, "loss_fn_input_spans", None) is None:
            raise ValueError(
                f"loss_fn={loss_fn!r} needs provenance on every datum, and datum {index} has none: one of its "
                "actions lacks a sequence_id (TokensWithLogprobs.sequence_id, which a custom sampler must set) "
                "or none of its targets is a sampled token; fix the data or train with another loss"
            )
