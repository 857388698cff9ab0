"""What the in-process training clients share: the request methods over one job queue.

:class:`QueuedTrainingClient` turns every request (``forward_backward``,
``optim_step``, saves and loads) into a job on the client's FIFO queue
(:class:`~.jobs.JobQueue`), so requests execute in submission order however
their results are awaited, and a cancelled wait leaves the queue intact. A
subclass supplies the model side, run in the worker thread:
:meth:`~QueuedTrainingClient._forward_backward`, :meth:`~QueuedTrainingClient._optim_step`,
:meth:`~.saved_weights.SavedWeights._write_state`, :meth:`~.saved_weights.SavedWeights._read_state`,
and the sampler side of :class:`~.sampler_source.SamplerSource` (snapshots and
in-flight weights).

The requests that save and load weights are :class:`~.saved_weights.SavedWeights`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tinker import types as tinker_types

from trio_rl.backends.local.jobs import LocalPendingResult
from trio_rl.backends.local.losses import check_loss_fn
from trio_rl.backends.local.optimizer import AdamState
from trio_rl.backends.local.runtime import BackendRuntime
from trio_rl.backends.local.sampler_source import SamplerT
from trio_rl.backends.local.saved_weights import SavedWeights


class QueuedTrainingClient(SavedWeights[SamplerT]):
    """The request methods of an in-process training client, in submission order.

    Args:
        runtime: the backend's nursery, thread limiter and folders.
        tokenizer: what :meth:`get_tokenizer` returns.
        adam: the optimizer state to continue from; fresh if ``None``.
    """

    def __init__(self, runtime: BackendRuntime, tokenizer: Any, adam: AdamState | None) -> None:
        super().__init__(runtime)
        self._tokenizer = tokenizer
        self._adam = adam if adam is not None else AdamState()

    # ------------------------------------------------ model side (worker thread)

    def _forward_backward(
        self, data: list[tinker_types.Datum], loss_fn: str, config: Mapping[str, float]
    ) -> tinker_types.ForwardBackwardOutput:
        raise NotImplementedError

    def _optim_step(self, adam_params: tinker_types.AdamParams) -> dict[str, float]:
        raise NotImplementedError

    # ------------------------------------------------------------------ requests

    @property
    def adam_state(self) -> AdamState:
        """The live optimizer state (for inspection)."""
        return self._adam

    async def forward_backward(
        self,
        data: Sequence[tinker_types.Datum],
        loss_fn: tinker_types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
    ) -> LocalPendingResult[tinker_types.ForwardBackwardOutput]:
        """Submit a forward/backward pass whose gradients add up until :meth:`optim_step`.

        Args:
            data: each datum's ``model_input`` and ``loss_fn_inputs`` of the same length.
            loss_fn: ``cross_entropy``, ``importance_sampling``, ``ppo``, ``cispo``
                or ``dro`` (see :mod:`trio_rl.backends.local.losses`).
            loss_fn_config: ``clip_low_threshold``/``clip_high_threshold`` for
                ``ppo`` and ``cispo`` (defaults 0.8 and 1.2).

        Returns:
            A pending result with per-datum ``logprobs`` and ``elementwise_loss``
            and the ``loss:sum`` metric. Logprobs are computed only at the
            positions that carry loss (and at ``mask`` positions); the others
            read 0.

        Raises:
            ValueError: at once, for an unsupported loss or config key; from
                ``result()``, for malformed data.
            RuntimeError: if the backend is not entered.
        """
        check_loss_fn(loss_fn, loss_fn_config)
        batch, config = list(data), dict(loss_fn_config or {})
        return self._jobs.submit(lambda: self._forward_backward(batch, loss_fn, config))

    async def optim_step(
        self, adam_params: tinker_types.AdamParams
    ) -> LocalPendingResult[tinker_types.OptimStepResponse]:
        """Submit one AdamW step (decoupled weight decay, optional global-norm clipping).

        Returns:
            A pending result whose metrics hold ``grad_norm`` (before clipping)
            and ``learning_rate``.

        Raises:
            RuntimeError: if the backend is not entered.
        """
        return self._jobs.submit(lambda: tinker_types.OptimStepResponse(metrics=self._optim_step(adam_params)))

    async def get_tokenizer(self) -> Any:
        """The tokenizer of the model being trained."""
        return self._tokenizer
