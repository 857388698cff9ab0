"""A FAKE tinker SDK for tests: no network, same threading model as the real one.

This is a stand-in, not the SDK. It exists so that ``TinkerBackend`` can be tested
against the things that make the real SDK awkward under Trio:

* every request runs on one daemon thread that runs an asyncio event loop
  (``tinker-standin-loop``), like the SDK's client-holder thread;
* submit methods return at once, with a ``concurrent.futures.Future`` that the loop
  thread completes after some latency (``sample`` in the 0.24 style), or an
  ``APIFuture`` around one (everything else, and ``sample`` in the 0.38 style) whose
  ``result_async()`` needs a running asyncio loop, so it fails under Trio as the real
  one does;
* a training client processes its requests in submission order (request ids are
  taken at submit time, then each request waits for its turn on the loop), even
  though random latency would otherwise reorder them;
* client creation and ``get_tokenizer`` really block the calling thread
  (``time.sleep``); in the 0.24 style creation returns the client itself, in the 0.38
  style a future of it that is also usable as the client.

``stable_reinforce`` is served as tinker 0.38 describes it (``SampleRequest.record_stability_info``,
``TrainingClient.create_sampling_client(record_stability_info=...)``, ``Datum.with_provenance`` and
``types/provenance_spans.py``; tinker-cookbook 0.6.1's ``_check_provenance`` and its note that the loss
accepts nonzero advantages only on sampled tokens): a sampler created with ``record_stability_info=True``
records each sequence it samples, under its ``sequence_id``; a ``stable_reinforce`` ``forward_backward``
is refused unless every Datum carries provenance whose spans name recorded sequences and reproduce
their prompt and sampled tokens, with zero advantages on prompt tokens. The 0.24 style has no
``record_stability_info`` parameter, as tinker 0.24.1 has none.

In-flight weights are served as tinker 0.38's ``types/sampling_client_kind.py`` describes them
(``TrainingClient.save_weights_and_get_sampling_client(kind=...)``):

* ``save_weights_and_get_sampling_client`` returns a future of the client at once and is ordered
  with the training client's other requests (its request id is taken at the call); the save is
  ephemeral: no name, no path (``model_path`` is ``None``). In the 0.24 style it blocks, returns
  the client, and has no ``kind``, as in tinker 0.24.1.
* all in-flight clients of one training client share one mutable weights target: an in-flight
  save updates it for the clients returned earlier too;
* a sample on an in-flight client runs on the client's weights or newer: each token is made
  with the target as it is when that token is made, so a running sample may finish on newer
  weights (a held ``"sample_token"`` gate stops running in-flight samples between tokens);
* the response does not say which weights made which token; the stand-in records it on the
  side, for tests (``inflight_token_steps``);
* snapshot saves (``save_weights_for_sampler`` and ``kind="snapshot"``) are pinned as before.

``StandinConfig.inflight_refusal`` makes the server refuse in-flight saves, as one without them would.

Tests can hold requests of one kind (:meth:`StandinServiceClient.hold`), make them
fail (:meth:`StandinServiceClient.fail_next`), and inspect what happened
(``events``, ``blocking_calls``, ``cancelled``, ``loop_errors``).

Use it through :func:`open_standin_service` (a context manager) or the
``standin_service`` pytest fixture; pass the result to
``TinkerBackend(service_client=...)``.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import itertools
import random
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, Literal, TypeVar

import pytest
import tinker
from tinker import types as tinker_types

from trio_rl import _tinker_compat

T = TypeVar("T")

RL_LOSS_INPUTS = ("target_tokens", "logprobs", "advantages")
LOSS_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": RL_LOSS_INPUTS,
    "ppo": RL_LOSS_INPUTS,
    "cispo": RL_LOSS_INPUTS,
    "dro": RL_LOSS_INPUTS,
    "stable_reinforce": RL_LOSS_INPUTS,
}
STABILITY_LOSSES = frozenset({"stable_reinforce"})
"""Losses the service trains only on sequences whose stability info it recorded, named by provenance."""


class StandinError(Exception):
    """Raised by the stand-in service: an injected fault, or a request the service refuses."""


@dataclasses.dataclass
class StandinConfig:
    """How the stand-in behaves. Latencies are real seconds: keep them tiny."""

    sdk_style: Literal["0.38", "0.24"] = "0.38"
    """0.38: creation returns a future of the client; 0.24: creation blocks and returns it."""
    latency_s: float = 0.001
    """Least time a request spends on the loop."""
    jitter_s: float = 0.003
    """Random extra latency per request, so that unordered requests would finish out of order."""
    blocking_create_s: float = 0.01
    """How long each client-creation call blocks its calling thread."""
    blocking_tokenizer_s: float = 0.0
    """How long ``get_tokenizer`` blocks its calling thread."""
    default_max_tokens: int = 8
    vocab_size: int = 256
    inflight_refusal: BaseException | None = None
    """Raised by every in-flight save when set: a server that refuses ``kind="inflight"``."""


class StandinAPIFuture(tinker.APIFuture[T]):
    """An ``APIFuture`` around a ``concurrent.futures.Future``, as the SDK returns."""

    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self._future = future

    def result(self, timeout: float | None = None) -> T:
        return self._future.result(timeout)

    async def result_async(self, timeout: float | None = None) -> T:
        # Exactly the SDK's implementation: it needs a running asyncio loop.
        async with asyncio.timeout(timeout):
            return await asyncio.wrap_future(self._future)

    def future(self) -> concurrent.futures.Future[T]:
        return self._future


class StandinTokenizer:
    """Bytes as tokens. Mirrors the Hugging Face signatures that matter."""

    def __init__(self, bos_token_id: int | None = None) -> None:
        self.bos_token_id = bos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        tokens = list(text.encode("utf-8"))
        if add_special_tokens and self.bos_token_id is not None:
            tokens.insert(0, self.bos_token_id)
        return tokens

    def decode(self, tokens: Sequence[int], skip_special_tokens: bool = False) -> str:
        del skip_special_tokens
        return bytes(t for t in tokens if 0 <= t < 256).decode("utf-8", errors="replace")


@dataclasses.dataclass
class _Checkpoint:
    kind: Literal["state", "sampler"]
    step: int
    base_model: str


class _Turns:
    """Submission-order turns of one training client. Used on the loop thread only."""

    def __init__(self) -> None:
        self._next = 0
        self._waiters: dict[int, asyncio.Event] = {}
        self._skipped: set[int] = set()

    async def wait_for(self, request_id: int) -> None:
        if self._next < request_id:
            event = self._waiters.setdefault(request_id, asyncio.Event())
            try:
                await event.wait()
            except asyncio.CancelledError:
                # The real SDK would leave later requests waiting forever here; the
                # stand-in skips the turn so a test can go on using the client.
                self._skipped.add(request_id)
                raise

    def done(self) -> None:
        self._next += 1
        while self._next in self._skipped:
            self._skipped.discard(self._next)
            self._next += 1
        if (event := self._waiters.pop(self._next, None)) is not None:
            event.set()


class _LoopThread:
    """One daemon thread running an asyncio loop, like the SDK's client holder."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(lambda _loop, context: errors.append(context))
        self.thread = threading.Thread(target=self._run, name="tinker-standin-loop", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, fn: Callable[[], object]) -> None:
        self.loop.call_soon_threadsafe(fn)

    def stop(self) -> None:
        async def cancel_everything() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running():
            with contextlib.suppress(Exception):
                self.submit(cancel_everything()).result(timeout=5)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


class StandinServiceClient:
    """Stands in for ``tinker.ServiceClient``; pass it to ``TinkerBackend(service_client=...)``.

    Attributes:
        config: The behaviour knobs.
        events: ``(what, model_id, op, request_id)`` tuples in the order they happened;
            ``what`` is ``"submit"`` (on the caller's thread) or ``"done"`` (when the
            loop thread processed it). Sampling requests are not recorded.
        blocking_calls: ``(call, thread name)`` for every call that blocked its caller.
        cancelled: How many requests of each op were cancelled on the loop.
        loop_errors: Everything the loop's exception handler saw; should stay empty.
        closed_with: The status passed to :meth:`close`, if it was called.
        training_clients: Every training client created, in order.
    """

    def __init__(self, config: StandinConfig | None = None, **overrides: Any) -> None:
        self.config = dataclasses.replace(config or StandinConfig(), **overrides)
        self.events: list[tuple[str, str, str, int]] = []
        self.blocking_calls: list[tuple[str, str]] = []
        self.cancelled: collections.Counter[str] = collections.Counter()
        self.loop_errors: list[dict[str, Any]] = []
        self.closed_with: str | None = None
        self.training_clients: list[StandinTrainingClient] = []
        self.checkpoints: dict[str, _Checkpoint] = {}
        self.stability_records: dict[str, tuple[list[int], list[int]]] = {}
        """``sequence_id`` -> (prompt tokens, sampled tokens) of every sequence sampled by a
        sampler created with ``record_stability_info=True``."""
        self.trained_losses: list[str] = []
        """The ``loss_fn`` of every ``forward_backward`` served, in order."""
        self.trained_prompt_heads: list[list[tuple[int, ...]]] = []
        """For every ``forward_backward`` served, the distinct first two prompt tokens of its data
        (a fake env's group, see ``trio_rl.testing.FakeEnv``)."""
        self.trained_chunk_types: list[list[list[str]]] = []
        """Per forward_backward, each datum's model_input chunk types (the service takes images)."""
        self.sampler_kinds: list[str] = []
        """The ``kind`` of every ``save_weights_and_get_sampling_client`` served, in order."""
        self.samples_started = 0
        """How many ``sample`` requests were submitted."""
        self.inflight_token_steps: list[list[int]] = []
        """For each sequence sampled on an in-flight client, the weights step of each token as it was made."""
        self._lock = threading.Lock()
        self._pending: collections.Counter[str] = collections.Counter()
        self._faults: dict[str, collections.deque[BaseException]] = collections.defaultdict(collections.deque)
        self._gates: dict[str, asyncio.Event] = {}  # loop thread only
        self._model_ids = itertools.count()
        self._loop_thread: _LoopThread | None = None
        self._rng = random.Random(0)

    # ---- test controls -------------------------------------------------------------

    def hold(self, op: str) -> None:
        """Make requests of ``op`` (e.g. ``"sample"``) wait until :meth:`release`."""
        loop_thread = self._loop()
        loop_thread.call_soon(lambda: self._gates.setdefault(op, asyncio.Event()))

    def release(self, op: str) -> None:
        """Let held requests of ``op`` go on."""

        def open_gate() -> None:
            if (gate := self._gates.pop(op, None)) is not None:
                gate.set()

        self._loop().call_soon(open_gate)

    def fail_next(self, op: str, error: BaseException, times: int = 1) -> None:
        """Complete the next ``times`` requests of ``op`` with ``error`` (the same object)."""
        with self._lock:
            self._faults[op].extend([error] * times)

    def pending(self, op: str) -> int:
        """How many requests of ``op`` are on the loop and not finished."""
        with self._lock:
            return self._pending[op]

    def shutdown(self) -> None:
        """Cancel everything still running and stop the loop thread."""
        if self._loop_thread is not None:
            self._loop_thread.stop()
            self._loop_thread = None

    # ---- the ServiceClient surface -------------------------------------------------

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
    ) -> Any:
        del train_mlp, train_attn, train_unembed, user_metadata
        self._block("create_lora_training_client", self.config.blocking_create_s)

        async def create() -> StandinTrainingClient:
            return self._new_training_client(base_model, rank=rank, seed=seed, step=0)

        return self._client_result(self._run("create_lora_training_client", create()), training=True)

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> Any:
        del user_metadata, weights_access_token
        return self._from_state("create_training_client_from_state", path, base_model, False)

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
    ) -> Any:
        del user_metadata, weights_access_token
        return self._from_state("create_training_client_from_state_with_optimizer", path, base_model, True)

    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool | None = None,
    ) -> Any:
        del retry_config
        record = self._stability_argument(record_stability_info)
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")
        self._block("create_sampling_client", self.config.blocking_create_s)
        return self._client_result(
            self._run("create_sampling_client", self._open_sampler(model_path, base_model, record)),
            training=False,
        )

    def close(self, status: str, detail: str | None = None) -> StandinAPIFuture[None]:
        del detail
        self.closed_with = status
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        return StandinAPIFuture(done)

    # ---- internals -----------------------------------------------------------------

    def _stability_argument(self, record_stability_info: bool | None) -> bool:
        if record_stability_info is not None and self.config.sdk_style == "0.24":
            # tinker 0.24.1's create_sampling_client has no such parameter.
            raise TypeError("create_sampling_client() got an unexpected keyword argument 'record_stability_info'")
        return bool(record_stability_info)

    def _check_stability(self, loss_fn: str, data: list[tinker_types.Datum]) -> None:
        """Refuse a ``stable_reinforce`` batch as the service would: provenance, recorded sequences, tokens."""
        for index, datum in enumerate(data):
            input_spans = getattr(datum, "model_input_spans", None)
            target_spans = getattr(datum, "loss_fn_input_spans", None)
            if input_spans is None or target_spans is None:
                raise StandinError(f"{loss_fn}: datum {index} has no provenance (Datum.with_provenance)")
            targets = [int(t) for t in datum.loss_fn_inputs["target_tokens"].tolist()]
            advantages = datum.loss_fn_inputs["advantages"].tolist()
            self._check_spans(loss_fn, index, "model_input", input_spans, datum.model_input.to_ints(), None)
            self._check_spans(loss_fn, index, "loss_fn_inputs", target_spans, targets, advantages)

    def _check_spans(
        self,
        loss_fn: str,
        index: int,
        field: str,
        spans: Sequence[Any],
        tokens: list[int],
        advantages: list[float] | None,
    ) -> None:
        position = 0
        for span in spans:
            with self._lock:
                record = self.stability_records.get(span.sequence_id)
            if record is None:
                raise StandinError(
                    f"{loss_fn}: datum {index} names sequence {span.sequence_id!r}, which has no stability info "
                    "(sample it with a client created with record_stability_info=True)"
                )
            prompt, sampled = record
            is_prompt = isinstance(span, tinker_types.PromptProvenanceSpan)
            source = prompt if is_prompt else sampled
            covered = tokens[position : position + span.length]
            if covered != source[span.offset : span.offset + span.length]:
                raise StandinError(f"{loss_fn}: datum {index}'s {field} spans do not reproduce sequence tokens")
            if advantages is not None and is_prompt and any(advantages[position : position + span.length]):
                raise StandinError(f"{loss_fn}: datum {index} has nonzero advantages on prompt tokens")
            position += span.length
        if position != len(tokens):
            raise StandinError(f"{loss_fn}: datum {index}'s {field} spans cover {position} of {len(tokens)} tokens")

    def _loop(self) -> _LoopThread:
        with self._lock:
            if self._loop_thread is None:
                self._loop_thread = _LoopThread(self.loop_errors)
            return self._loop_thread

    def _block(self, call: str, seconds: float) -> None:
        with self._lock:
            self.blocking_calls.append((call, threading.current_thread().name))
        time.sleep(seconds)

    def _run(self, op: str, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return self._loop().submit(self._serve(op, coro))

    async def _serve(self, op: str, coro: Coroutine[Any, Any, T]) -> T:
        """Run one request on the loop: gate, latency, injected fault, then the work."""
        with self._lock:
            self._pending[op] += 1
        try:
            if (gate := self._gates.get(op)) is not None:
                await gate.wait()
            with self._lock:
                delay = self.config.latency_s + self._rng.random() * self.config.jitter_s
                fault = self._faults[op].popleft() if self._faults[op] else None
            await asyncio.sleep(delay)
            if fault is not None:
                coro.close()
                raise fault
            return await coro
        except asyncio.CancelledError:
            with self._lock:
                self.cancelled[op] += 1
            coro.close()
            raise
        finally:
            with self._lock:
                self._pending[op] -= 1

    def _client_result(self, future: concurrent.futures.Future[Any], *, training: bool) -> Any:
        if self.config.sdk_style == "0.24":
            return future.result()  # really blocks, as 0.24's creation methods do
        wrapper = StandinTrainingClientFuture if training else StandinSamplingClientFuture
        return wrapper(future)

    def _new_training_client(self, base_model: str, *, rank: int, seed: int | None, step: int) -> StandinTrainingClient:
        with self._lock:
            model_id = f"standin-model-{next(self._model_ids)}"
        client = StandinTrainingClient(self, model_id, base_model, rank=rank, seed=seed, step=step)
        with self._lock:
            self.training_clients.append(client)
        return client

    def _from_state(self, call: str, path: str, base_model: str | None, optimizer: bool) -> Any:
        self._block(call, self.config.blocking_create_s)

        async def create() -> StandinTrainingClient:
            checkpoint = self._checkpoint(path, "state")
            client = self._new_training_client(
                base_model or checkpoint.base_model, rank=32, seed=None, step=checkpoint.step
            )
            client.loaded.append((path, optimizer))
            return client

        return self._client_result(self._run(call, create()), training=True)

    async def _open_sampler(
        self, model_path: str | None, base_model: str | None, record_stability_info: bool = False
    ) -> StandinSamplingClient:
        if model_path is None:
            assert base_model is not None
            return StandinSamplingClient(
                self, model_path=None, base_model=base_model, weights_step=0, record=record_stability_info
            )
        checkpoint = self._checkpoint(model_path, "sampler")
        return StandinSamplingClient(
            self,
            model_path=model_path,
            base_model=checkpoint.base_model,
            weights_step=checkpoint.step,
            record=record_stability_info,
        )

    def _checkpoint(self, path: str, kind: Literal["state", "sampler"]) -> _Checkpoint:
        with self._lock:
            checkpoint = self.checkpoints.get(path)
        if checkpoint is None or checkpoint.kind != kind:
            raise StandinError(f"no {kind} checkpoint at {path!r}")
        return checkpoint


class StandinTrainingClient:
    """Stands in for ``tinker.TrainingClient``. Requests are processed in submission order.

    Attributes:
        step: How many optimizer steps were applied to its weights.
        loaded: ``(path, with_optimizer)`` for every state it was created from or loaded.
    """

    def __init__(
        self,
        service: StandinServiceClient,
        model_id: str,
        base_model: str,
        *,
        rank: int,
        seed: int | None,
        step: int,
    ) -> None:
        self.service = service
        self.model_id = model_id
        self.base_model = base_model
        self.rank = rank
        self.seed = seed
        self.step = step
        self.inflight_step: int | None = None
        """The step of the in-flight weights its in-flight clients share (loop thread only)."""
        self.loaded: list[tuple[str, bool]] = []
        self._request_ids = itertools.count()
        self._turns = _Turns()

    def forward_backward(
        self,
        data: list[tinker_types.Datum],
        loss_fn: tinker_types.LossFnType,
        loss_fn_config: dict[str, float] | None = None,
    ) -> StandinAPIFuture[tinker_types.ForwardBackwardOutput]:
        del loss_fn_config
        if not data:
            raise ValueError("No data provided")
        data = list(data)

        def work() -> tinker_types.ForwardBackwardOutput:
            needed = LOSS_INPUTS.get(loss_fn)
            if needed is None:
                raise StandinError(f"unknown loss_fn {loss_fn!r}")
            if self.service.config.sdk_style == "0.24" and loss_fn in STABILITY_LOSSES:
                raise StandinError(f"unknown loss_fn {loss_fn!r}")  # 0.24.1's LossFnType lacks it
            for datum in data:
                missing = [k for k in needed if k not in datum.loss_fn_inputs]
                if missing:
                    raise StandinError(f"{loss_fn} needs loss_fn_inputs {missing}")
            if loss_fn in STABILITY_LOSSES:
                self.service._check_stability(loss_fn, data)
            with self.service._lock:
                self.service.trained_losses.append(loss_fn)
                self.service.trained_prompt_heads.append(sorted({_text_head(d.model_input) for d in data}))
                self.service.trained_chunk_types.append([[c.type for c in d.model_input.chunks] for d in data])
            outputs: list[dict[str, tinker_types.TensorData]] = []
            total = 0.0
            for datum in data:
                n = len(datum.loss_fn_inputs["target_tokens"].tolist())
                logprob = -1.0 / (1 + self.step)
                outputs.append({"logprobs": _tinker_compat.tensor([logprob] * n, "float32")})
                total += -logprob * n
            return _tinker_compat.forward_backward_output(outputs, {"loss:sum": total})

        return self._submit("forward_backward", work)

    def optim_step(self, adam_params: tinker_types.AdamParams) -> StandinAPIFuture[tinker_types.OptimStepResponse]:
        if not isinstance(adam_params, tinker_types.AdamParams):
            raise TypeError("Expected AdamParams")

        def work() -> tinker_types.OptimStepResponse:
            self.step += 1
            return tinker_types.OptimStepResponse(metrics={"step": float(self.step)})

        return self._submit("optim_step", work)

    def save_state(
        self, name: str, ttl_seconds: int | None = None
    ) -> StandinAPIFuture[tinker_types.SaveWeightsResponse]:
        del ttl_seconds
        return self._save("save_state", f"weights/{name}", "state", tinker_types.SaveWeightsResponse)

    def save_weights_for_sampler(
        self, name: str, ttl_seconds: int | None = None
    ) -> StandinAPIFuture[tinker_types.SaveWeightsForSamplerResponse]:
        del ttl_seconds
        return self._save(
            "save_weights_for_sampler", f"sampler_weights/{name}", "sampler", tinker_types.SaveWeightsForSamplerResponse
        )

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool | None = None,
        kind: str | None = None,
    ) -> Any:
        del name, retry_config
        if kind is not None and self.service.config.sdk_style == "0.24":
            raise TypeError("save_weights_and_get_sampling_client() got an unexpected keyword argument 'kind'")
        record = self.service._stability_argument(record_stability_info)
        kind = kind or "snapshot"

        def work() -> StandinSamplingClient:
            refusal = self.service.config.inflight_refusal
            if kind == "inflight" and refusal is not None:
                raise refusal
            if kind == "inflight":
                self.inflight_step = self.step
            with self.service._lock:
                self.service.sampler_kinds.append(kind)
            return StandinSamplingClient(
                self.service,
                model_path=None,
                base_model=self.base_model,
                weights_step=self.step,
                record=record,
                inflight_of=self if kind == "inflight" else None,
            )

        future = self._submit("save_weights_and_get_sampling_client", work).future()
        if self.service.config.sdk_style == "0.24":
            return future.result()  # really blocks, as 0.24.1's does
        return StandinSamplingClientFuture(future)

    def load_state(
        self, path: str, weights_access_token: str | None = None
    ) -> StandinAPIFuture[tinker_types.LoadWeightsResponse]:
        del weights_access_token
        return self._submit("load_state", lambda: self._load(path, optimizer=False))

    def load_state_with_optimizer(
        self, path: str, weights_access_token: str | None = None
    ) -> StandinAPIFuture[tinker_types.LoadWeightsResponse]:
        del weights_access_token
        return self._submit("load_state_with_optimizer", lambda: self._load(path, optimizer=True))

    def create_sampling_client(
        self, model_path: str, retry_config: Any = None, record_stability_info: bool | None = None
    ) -> Any:
        return self.service.create_sampling_client(
            model_path=model_path, retry_config=retry_config, record_stability_info=record_stability_info
        )

    def get_tokenizer(self) -> StandinTokenizer:
        self.service._block("get_tokenizer", self.service.config.blocking_tokenizer_s)
        return StandinTokenizer(bos_token_id=1)

    def _load(self, path: str, *, optimizer: bool) -> tinker_types.LoadWeightsResponse:
        self.step = self.service._checkpoint(path, "state").step
        self.loaded.append((path, optimizer))
        return tinker_types.LoadWeightsResponse(path=path)

    def _save(
        self, op: str, folder: str, kind: Literal["state", "sampler"], response: Callable[..., T]
    ) -> StandinAPIFuture[T]:
        """Request ``op``: in its turn, this step's weights become a ``kind`` checkpoint at ``tinker://<model>/<folder>``."""
        path = f"tinker://{self.model_id}/{folder}"

        def work() -> T:
            with self.service._lock:
                self.service.checkpoints[path] = _Checkpoint(kind, self.step, self.base_model)
            return response(path=path)

        return self._submit(op, work)

    def _submit(self, op: str, work: Callable[[], T]) -> StandinAPIFuture[T]:
        service = self.service
        with service._lock:
            request_id = next(self._request_ids)
            service.events.append(("submit", self.model_id, op, request_id))

        async def in_turn() -> T:
            await self._turns.wait_for(request_id)
            try:
                # The latency and faults of _serve apply inside the turn, as on the server.
                result = await service._serve(op, _call(work))
                with service._lock:
                    service.events.append(("done", self.model_id, op, request_id))
                return result
            finally:
                self._turns.done()

        return StandinAPIFuture(service._loop().submit(in_turn()))


class StandinSamplingClient:
    """Stands in for ``tinker.SamplingClient``: pinned to the weights it was made from, or in-flight.

    Attributes:
        weights_step: The training step of the weights it samples from (in-flight: the
            oldest it may sample from).
        record_stability_info: Whether the service records each sampled sequence (for
            ``stable_reinforce``).
        inflight_of: For an in-flight client, the training client whose in-flight weights it follows.
    """

    def __init__(
        self,
        service: StandinServiceClient,
        *,
        model_path: str | None,
        base_model: str,
        weights_step: int,
        record: bool = False,
        inflight_of: StandinTrainingClient | None = None,
    ) -> None:
        self.service = service
        self.model_path = model_path
        self.base_model = base_model
        self.weights_step = weights_step
        self.record_stability_info = record
        self.inflight_of = inflight_of

    def sample(
        self,
        prompt: tinker_types.ModelInput,
        num_samples: int,
        sampling_params: tinker_types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> Any:
        del include_prompt_logprobs, topk_prompt_logprobs
        prompt_tokens = prompt.to_ints()
        with self.service._lock:
            self.service.samples_started += 1

        async def work() -> tinker_types.SampleResponse:
            config = self.service.config
            max_tokens = sampling_params.max_tokens or config.default_max_tokens
            sequences = []
            for index in range(num_samples):
                rng = self._rng(prompt_tokens, sampling_params.seed, index)
                if self.inflight_of is None:
                    tokens = [rng.randrange(config.vocab_size) for _ in range(max_tokens)]
                else:
                    tokens = await self._inflight_tokens(rng, max_tokens)
                logprobs = [-2.0 * rng.random() for _ in tokens]
                sequence = _tinker_compat.sampled_sequence(tokens, logprobs, "length")
                if self.record_stability_info:
                    with self.service._lock:
                        self.service.stability_records[sequence.sequence_id] = (list(prompt_tokens), tokens)
                sequences.append(sequence)
            return _tinker_compat.sample_response(sequences)

        return self._future(self.service._run("sample", work()))

    async def _inflight_tokens(self, rng: random.Random, max_tokens: int) -> list[int]:
        """Tokens made one at a time, each on the in-flight weights as they are then (loop thread)."""
        assert self.inflight_of is not None
        steps: list[int] = []
        with self.service._lock:
            self.service.inflight_token_steps.append(steps)
        tokens = []
        for position in range(max_tokens):
            if position and (gate := self.service._gates.get("sample_token")) is not None:
                await gate.wait()
            target = self.inflight_of.inflight_step
            assert target is not None and target >= self.weights_step, "in-flight weights never go back"
            steps.append(target)
            tokens.append(rng.randrange(self.service.config.vocab_size))
            await asyncio.sleep(0)  # a save may land between two tokens
        return tokens

    def _rng(self, prompt_tokens: list[int], seed: int | None, index: int) -> random.Random:
        # With a seed, the same weights, prompt and seed give the same samples; without
        # one, every sample differs, as on a real sampler.
        if seed is None:
            with self.service._lock:
                return random.Random(self.service._rng.random())
        return random.Random(f"{self.weights_step}:{prompt_tokens}:{seed}:{index}")

    def compute_logprobs(self, prompt: tinker_types.ModelInput) -> Any:
        n = prompt.length

        async def work() -> list[float | None]:
            return [None] + [-1.0] * (n - 1)

        return self._future(self.service._run("compute_logprobs", work()))

    def get_tokenizer(self) -> StandinTokenizer:
        self.service._block("get_tokenizer", self.service.config.blocking_tokenizer_s)
        return StandinTokenizer(bos_token_id=1)

    def _future(self, future: concurrent.futures.Future[T]) -> Any:
        # 0.24 returned the bare concurrent future; 0.38 an APIFuture around it.
        if self.service.config.sdk_style == "0.24":
            return future
        return StandinAPIFuture(future)


class _ClientFutureMixin:
    """Like 0.38's ``Backcompat*ClientFuture``: a future of a client that can also be
    used as the client, forwarding attribute reads (methods too) to the finished one."""

    _future: concurrent.futures.Future[Any]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._future.result(), name)


class StandinTrainingClientFuture(_ClientFutureMixin, StandinAPIFuture[StandinTrainingClient]):
    pass


class StandinSamplingClientFuture(_ClientFutureMixin, StandinAPIFuture[StandinSamplingClient]):
    pass


async def _call(fn: Callable[[], T]) -> T:
    return fn()


@contextlib.contextmanager
def open_standin_service(config: StandinConfig | None = None, **overrides: Any) -> Iterator[StandinServiceClient]:
    """A stand-in service client whose loop thread is stopped on exit.

    Args:
        config: Behaviour knobs; defaults to :class:`StandinConfig()`.
        **overrides: Fields of :class:`StandinConfig` to change.

    Yields:
        The service client, for ``TinkerBackend(service_client=...)``.
    """
    service = StandinServiceClient(config, **overrides)
    try:
        yield service
    finally:
        service.shutdown()


@pytest.fixture
def standin_service() -> Iterator[StandinServiceClient]:
    """A default stand-in service client (0.38 style, millisecond latencies)."""
    with open_standin_service() as service:
        yield service


def _text_head(model_input: tinker_types.ModelInput) -> tuple[int, ...]:
    """The first two token ids of ``model_input``'s text chunks (image chunks hold none)."""
    chunks = model_input.chunks
    return tuple([t for c in chunks if isinstance(c, tinker_types.EncodedTextChunk) for t in c.tokens[:2]][:2])
