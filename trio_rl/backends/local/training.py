"""The local training client: an ordered queue of torch jobs on one model.

Every request (``forward_backward``, ``optim_step``, saves and loads) becomes a
job on the client's FIFO queue, and one worker task (started in the backend's
nursery when work arrives, gone when the queue is empty) runs the jobs one by
one in a worker thread. So requests execute in submission order however their
results are awaited, and a cancelled wait for a result leaves the queue intact:
the job still runs, as on the Tinker service where a submitted request is not
taken back.
"""

from __future__ import annotations

import shutil
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np
import torch
import trio
from tinker import types as tinker_types

from trio_rl import _tinker_compat
from trio_rl.backends.local.checkpoint import check_name, load_checkpoint, save_checkpoint
from trio_rl.backends.local.losses import LOSS_FUNCTIONS, REQUIRED_INPUTS, check_loss_fn
from trio_rl.backends.local.model import TransformerLM, causal_mask
from trio_rl.backends.local.optimizer import AdamState, adam_step
from trio_rl.backends.local.runtime import BackendRuntime
from trio_rl.backends.local.sampler import LocalSamplingClient, SamplingEngine
from trio_rl.backends.local.tokenizer import CharTokenizer

T = TypeVar("T")


def _as_array(value: object) -> np.ndarray:
    """A ``loss_fn_inputs`` value (TensorData on any SDK version, numpy, torch, list) as numpy."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    to_numpy = getattr(value, "to_numpy", None)
    if callable(to_numpy):
        return np.asarray(to_numpy())
    data = getattr(value, "data", value)
    return np.asarray(data)


def forward_backward_batch(
    model: TransformerLM,
    data: Sequence[tinker_types.Datum],
    loss_fn: str,
    loss_fn_config: Mapping[str, float],
) -> tinker_types.ForwardBackwardOutput:
    """Run one forward/backward pass over ``data``, adding to the parameters' gradients.

    All data go through the model as one right-padded batch; the loss is the sum
    over data of each datum's summed per-token loss (see :mod:`.losses`).

    Args:
        model: the float32 training model.
        data: each datum's ``model_input`` and ``loss_fn_inputs`` of the same length.
        loss_fn: one of :data:`.losses.LOSS_FUNCTIONS`.
        loss_fn_config: clip thresholds for ``ppo``/``cispo``.

    Returns:
        Per datum ``logprobs`` and ``elementwise_loss`` (float32, one per position)
        and the metric ``loss:sum``.

    Raises:
        ValueError: for missing inputs, mismatched lengths or out-of-range tokens.
    """
    if not data:
        return _tinker_compat.forward_backward_output([], {"loss:sum": 0.0})
    max_len, vocab = model.config.max_seq_len, model.vocab_size
    seqs = [datum.model_input.to_ints() for datum in data]
    inputs: list[dict[str, torch.Tensor]] = []
    for i, (datum, seq) in enumerate(zip(data, seqs)):
        if not seq:
            raise ValueError(f"datum {i} has an empty model_input")
        if len(seq) > max_len:
            raise ValueError(f"datum {i} has {len(seq)} tokens, more than max_seq_len {max_len}")
        missing = [k for k in REQUIRED_INPUTS[loss_fn] if k not in datum.loss_fn_inputs]
        if missing:
            raise ValueError(f"datum {i} lacks loss_fn_inputs {missing} needed by {loss_fn!r}")
        tensors: dict[str, torch.Tensor] = {}
        for key, value in datum.loss_fn_inputs.items():
            array = _as_array(value).reshape(-1)
            if array.shape[0] != len(seq):
                raise ValueError(f"datum {i}: loss_fn_inputs[{key!r}] has {array.shape[0]} values for {len(seq)} tokens")
            dtype = torch.long if key == "target_tokens" else torch.float32
            tensors[key] = torch.as_tensor(array.copy()).to(dtype)
        targets = tensors["target_tokens"]
        if len(seq) and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
            raise ValueError(f"datum {i} has target tokens outside [0, {vocab})")
        if any(not 0 <= t < vocab for t in seq):
            raise ValueError(f"datum {i} has input tokens outside [0, {vocab})")
        inputs.append(tensors)

    lengths = torch.tensor([len(s) for s in seqs])
    width = int(lengths.max())
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    targets = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, (seq, tensors) in enumerate(zip(seqs, inputs)):
        tokens[i, : len(seq)] = torch.tensor(seq)
        targets[i, : len(seq)] = tensors["target_tokens"]
    positions = torch.arange(width).expand(len(seqs), width)
    with torch.enable_grad():
        logits, _ = model(tokens, positions, causal_mask(lengths, width))
        logprobs = torch.log_softmax(logits, dim=-1).gather(2, targets[:, :, None])[:, :, 0]
        fn = LOSS_FUNCTIONS[loss_fn]
        per_datum = [fn(logprobs[i, : len(seq)], inputs[i], loss_fn_config) for i, seq in enumerate(seqs)]
        total = torch.stack([loss.sum() for loss in per_datum]).sum()
        total.backward()  # type: ignore[no-untyped-call]
    outputs = [
        {
            "logprobs": _tinker_compat.tensor(logprobs[i, : len(seq)].detach().numpy(), "float32"),
            "elementwise_loss": _tinker_compat.tensor(per_datum[i].detach().numpy(), "float32"),
        }
        for i, seq in enumerate(seqs)
    ]
    return _tinker_compat.forward_backward_output(outputs, {"loss:sum": float(total.detach())})


@dataclass(eq=False)
class _Job:
    run: Callable[[], Any]
    done: trio.Event = field(default_factory=trio.Event)
    value: Any = None
    error: BaseException | None = None


def _discard_sampler_folder(path: Path, states_saved: set[str]) -> None:
    """Delete a sampler snapshot no client uses any more, unless a saved state shares its step's name."""
    if path.name not in states_saved:
        shutil.rmtree(path, ignore_errors=True)


class LocalPendingResult(Generic[T]):
    """A request submitted to a :class:`LocalTrainingClient`; :meth:`result` waits for it."""

    def __init__(self, job: _Job) -> None:
        self._job = job

    async def result(self) -> T:
        """Wait until the request has run and return its answer.

        Cancelling this wait does not withdraw the request (it keeps its place in
        the queue and still runs), so later requests see the state it leaves.
        It may be awaited again, or by several tasks.

        Raises:
            Exception: whatever the request raised.
            RuntimeError: if the backend closed before the request finished.
        """
        await self._job.done.wait()
        if self._job.error is not None:
            raise self._job.error
        return self._job.value  # type: ignore[no-any-return]


class LocalTrainingClient:
    """Trains a full-parameter copy of the model (LoRA rank is ignored locally).

    Get one from ``LocalBackend.create_training_client``.
    """

    def __init__(
        self,
        runtime: BackendRuntime,
        model: TransformerLM,
        tokenizer: CharTokenizer,
        adam: AdamState | None = None,
    ) -> None:
        self._runtime = runtime
        self._model = model
        self._tokenizer = tokenizer
        self._adam = adam if adam is not None else AdamState()
        self._queue: deque[_Job] = deque()
        self._working = False
        self._states_saved: set[str] = set()

    @property
    def model(self) -> TransformerLM:
        """The live training model (for inspection; mutate it only through requests)."""
        return self._model

    @property
    def adam_state(self) -> AdamState:
        """The live optimizer state (for inspection)."""
        return self._adam

    def _submit(self, run: Callable[[], Any]) -> _Job:
        self._runtime.require_entered()
        job = _Job(run)
        if not self._working:
            self._runtime.spawn(self._work)
            self._working = True
        self._queue.append(job)
        return job

    async def _work(self) -> None:
        try:
            while self._queue:
                job = self._queue[0]
                try:
                    job.value = await trio.to_thread.run_sync(job.run, limiter=self._runtime.limiter)
                except trio.Cancelled:
                    raise
                except Exception as exc:
                    job.error = exc
                self._queue.popleft()
                job.done.set()
        finally:
            self._working = False
            closed = RuntimeError("the LocalBackend was closed before this request finished")
            for job in self._queue:
                job.error = closed
                job.done.set()
            self._queue.clear()

    async def _call(self, run: Callable[[], T]) -> T:
        return await LocalPendingResult[T](self._submit(run)).result()

    async def forward_backward(
        self,
        data: Sequence[tinker_types.Datum],
        loss_fn: tinker_types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
    ) -> LocalPendingResult[tinker_types.ForwardBackwardOutput]:
        """Submit a forward/backward pass whose gradients add up until :meth:`optim_step`.

        Args:
            data: the batch; see :func:`forward_backward_batch`.
            loss_fn: ``cross_entropy``, ``importance_sampling``, ``ppo`` or ``cispo``.
            loss_fn_config: ``clip_low_threshold``/``clip_high_threshold`` for
                ``ppo`` and ``cispo`` (defaults 0.8 and 1.2).

        Returns:
            A pending result with per-datum ``logprobs`` and ``elementwise_loss``
            and the ``loss:sum`` metric.

        Raises:
            ValueError: at once, for an unsupported loss or config key; from
                ``result()``, for malformed data.
            RuntimeError: if the backend is not entered.
        """
        check_loss_fn(loss_fn, loss_fn_config)
        batch = list(data)
        config = dict(loss_fn_config or {})
        return LocalPendingResult(
            self._submit(lambda: forward_backward_batch(self._model, batch, loss_fn, config))
        )

    async def optim_step(
        self, adam_params: tinker_types.AdamParams
    ) -> LocalPendingResult[tinker_types.OptimStepResponse]:
        """Submit one Adam step (decoupled weight decay, optional global-norm clipping).

        Returns:
            A pending result whose metrics hold ``grad_norm`` (before clipping)
            and ``learning_rate``.

        Raises:
            RuntimeError: if the backend is not entered.
        """

        def step() -> tinker_types.OptimStepResponse:
            return tinker_types.OptimStepResponse(metrics=adam_step(self._model, self._adam, adam_params))

        return LocalPendingResult(self._submit(step))

    async def save_weights_for_sampler(self, name: str) -> LocalSamplingClient:
        """Save the weights (after every request submitted before) and return a pinned sampler.

        Args:
            name: folder name under ``<log_dir>/sampler_weights/``.

        Returns:
            A sampling client over a copy of the weights; its ``model_path`` is the folder.

        Raises:
            ValueError: if ``name`` is not a plain file name.
            RuntimeError: if the backend is not entered.
        """
        check_name(name)
        path = self._runtime.log_dir / "sampler_weights" / name

        def save() -> LocalSamplingClient:
            engine = SamplingEngine(self._model, self._tokenizer, self._runtime)
            save_checkpoint(
                path,
                weights=self._model.state_dict(),
                adam=None,
                model_config=self._model.config,
                tokenizer=self._tokenizer,
                kind="sampler",
            )
            client = LocalSamplingClient(engine, str(path))
            # The folder is only this client's record on disk: once no one holds
            # the client, it goes, unless a saved state of the same step keeps it.
            weakref.finalize(client, _discard_sampler_folder, path, self._states_saved)
            return client

        return await self._call(save)

    async def save_state(self, name: str) -> str:
        """Save weights, Adam moments and step count to ``<log_dir>/checkpoints/<name>``.

        Returns:
            The folder's path, for :meth:`load_state` or
            ``LocalBackend.create_training_client_from_state``.

        Raises:
            ValueError: if ``name`` is not a plain file name.
            RuntimeError: if the backend is not entered.
        """
        check_name(name)
        path = self._runtime.log_dir / "checkpoints" / name

        def save() -> str:
            save_checkpoint(
                path,
                weights=self._model.state_dict(),
                adam=self._adam,
                model_config=self._model.config,
                tokenizer=self._tokenizer,
                kind="state",
            )
            self._states_saved.add(name)
            return str(path)

        return await self._call(save)

    async def load_state(self, path: str, *, with_optimizer: bool = True) -> None:
        """Replace the weights (and, if asked, the optimizer state) with a saved state.

        Without the optimizer, Adam restarts from step 0 with zero moments.
        Accumulated gradients are dropped either way.

        Raises:
            FileNotFoundError: if ``path`` is not a checkpoint.
            ValueError: if the checkpoint's model config or tokenizer differ from
                this client's, or it has no optimizer state and one was asked for.
            RuntimeError: if the backend is not entered.
        """

        def load() -> None:
            ckpt = load_checkpoint(Path(path), with_optimizer=with_optimizer)
            if ckpt.model_config != self._model.config or ckpt.tokenizer != self._tokenizer:
                raise ValueError(f"{path} was saved from a model of another shape or tokenizer")
            self._model.load_state_dict(ckpt.weights)
            self._model.zero_grad(set_to_none=True)
            self._adam = ckpt.adam if ckpt.adam is not None else AdamState()

        await self._call(load)

    async def get_tokenizer(self) -> CharTokenizer:
        """The tokenizer of the model being trained."""
        return self._tokenizer
