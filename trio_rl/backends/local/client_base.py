"""What the in-process training clients share: the request methods over one job queue.

:class:`QueuedTrainingClient` turns every request (``forward_backward``,
``optim_step``, saves and loads) into a job on the client's FIFO queue
(:class:`~.jobs.JobQueue`), so requests execute in submission order however
their results are awaited, and a cancelled wait leaves the queue intact. A
subclass supplies the model side, run in the worker thread:
:meth:`~QueuedTrainingClient._forward_backward`, :meth:`~QueuedTrainingClient._optim_step`,
:meth:`~QueuedTrainingClient._write_state`, :meth:`~QueuedTrainingClient._read_state`,
and the sampler side of :class:`~.sampler_source.SamplerSource` (snapshots and
in-flight weights).

A sampler's folder under ``sampler_weights/`` lives only as long as some
sampling client uses it (it goes when the client is garbage-collected), unless
a state saved under the same name keeps it: so the disk holds the snapshots in
use, not one per step.
"""

from __future__ import annotations

import shutil
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tinker import types as tinker_types

from trio_rl.backends.local.checkpoint import check_name
from trio_rl.backends.local.jobs import JobQueue, LocalPendingResult
from trio_rl.backends.local.losses import check_loss_fn
from trio_rl.backends.local.optimizer import AdamState
from trio_rl.backends.local.runtime import BackendRuntime
from trio_rl.backends.local.sampler_source import SamplerSource, SamplerT


def _discard_sampler_folder(path: Path, states_saved: set[str]) -> None:
    """Delete a sampler folder no client uses any more, unless a saved state shares its name."""
    if path.name not in states_saved:
        shutil.rmtree(path, ignore_errors=True)


class QueuedTrainingClient(SamplerSource[SamplerT]):
    """The request methods of an in-process training client, in submission order.

    Args:
        runtime: the backend's nursery, thread limiter and folders.
        tokenizer: what :meth:`get_tokenizer` returns.
        adam: the optimizer state to continue from; fresh if ``None``.
    """

    def __init__(self, runtime: BackendRuntime, tokenizer: Any, adam: AdamState | None) -> None:
        self._runtime = runtime
        self._tokenizer = tokenizer
        self._adam = adam if adam is not None else AdamState()
        self._jobs = JobQueue(runtime)
        self._states_saved: set[str] = set()

    # ------------------------------------------------ model side (worker thread)

    def _forward_backward(
        self, data: list[tinker_types.Datum], loss_fn: str, config: Mapping[str, float]
    ) -> tinker_types.ForwardBackwardOutput:
        raise NotImplementedError

    def _optim_step(self, adam_params: tinker_types.AdamParams) -> dict[str, float]:
        raise NotImplementedError

    def _write_state(self, path: Path) -> None:
        raise NotImplementedError

    def _read_state(self, path: Path, with_optimizer: bool) -> None:
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

    async def save_weights_for_sampler(self, name: str, *, inflight: bool = False) -> SamplerT:
        """Snapshot the weights (after every request submitted before) and return a sampler of them.

        The snapshot is also written to ``<log_dir>/sampler_weights/<name>``
        (the client's ``model_path``), which is deleted once no one holds the
        client, unless :meth:`save_state` saved a state of the same name.

        Args:
            name: the folder's name.
            inflight: ``False``: the sampler is pinned to these weights.
                ``True``: they become this client's in-flight weights (version:
                the ``optim_step`` calls so far), which every in-flight sampler
                of it, running requests included, samples from its next decode
                step on (see :mod:`~.inflight`); the returned sampler is one more.

        Raises:
            ValueError: if ``name`` is not a plain file name.
            RuntimeError: if the backend is not entered.
        """
        check_name(name)
        path = self._runtime.log_dir / "sampler_weights" / name

        def save() -> SamplerT:
            client = self._publish(path) if inflight else self._sampler(path)
            weakref.finalize(client, _discard_sampler_folder, path, self._states_saved)
            return client

        return await self._jobs.call(save)

    async def create_sampling_client(self) -> SamplerT:
        """A pinned sampler over the current weights, without writing anything to disk."""
        return await self._jobs.call(lambda: self._sampler(None))

    async def save_state(self, name: str) -> str:
        """Save the weights and Adam's state to ``<log_dir>/checkpoints/<name>``.

        Returns:
            The folder's path, for :meth:`load_state` or the backend's
            ``create_training_client_from_state``.

        Raises:
            ValueError: if ``name`` is not a plain file name.
            RuntimeError: if the backend is not entered.
        """
        check_name(name)
        path = self._runtime.log_dir / "checkpoints" / name

        def save() -> str:
            self._write_state(path)
            self._states_saved.add(name)
            return str(path)

        return await self._jobs.call(save)

    async def load_state(self, path: str, *, with_optimizer: bool = True) -> None:
        """Replace the weights (and, if asked, Adam's state) with a saved state.

        Without the optimizer, Adam restarts from step 0 with zero moments.
        Accumulated gradients are dropped either way.

        Raises:
            FileNotFoundError: if ``path`` is not a checkpoint.
            ValueError: if the checkpoint does not fit this client's model, or
                has no optimizer state and one was asked for.
            RuntimeError: if the backend is not entered.
        """
        await self._jobs.call(lambda: self._read_state(Path(path), with_optimizer))

    async def get_tokenizer(self) -> Any:
        """The tokenizer of the model being trained."""
        return self._tokenizer
