"""Run asyncio-flavoured user code (tinker-cookbook's envs, evaluators) inside a Trio run.

trio_rl is Trio all the way down; tinker-cookbook's envs and evaluators are
asyncio coroutines that call ``asyncio.gather``, ``asyncio.to_thread``,
``asyncio.Semaphore`` and friends, which fail under Trio. This module, the only
one in trio_rl that imports asyncio, makes them run unchanged, on
`trio-asyncio <https://trio-asyncio.readthedocs.io>`_:

- :func:`open_user_code_runner` makes a :class:`UserCodeRunner` current for
  every task the run starts. The first call that needs asyncio opens one
  asyncio loop as a task of the run's nursery; it closes when the run's stages
  end (or are cancelled), so it never outlives the run. A run that never needs
  asyncio never imports trio-asyncio (whose import patches asyncio's loop
  functions for the whole process).
- :func:`call_user` is how trio_rl calls every coroutine method of user
  objects (``Env.initial_observation`` / ``step``, ``EnvGroupBuilder.make_envs``
  / ``make_env`` / ``compute_group_rewards`` / ``cleanup``); :func:`call_evaluator`
  calls evaluators. Each call runs either natively in Trio or as an asyncio
  task on the run's loop, decided per call (see :class:`UserCodeRunner`).
- :class:`DualSamplingClient` is the other direction: a trio_rl sampling client
  that asyncio code can await, with the tinker SDK's names (``sample``,
  ``sample_async``, ``compute_logprobs``, ``compute_logprobs_async``). Bridged
  evaluators receive one; wrap a client yourself for a cookbook completer.

Which domain a coroutine needs cannot be read off the coroutine (both kinds are
plain ``async def``), so :data:`BridgeMode` lets the run choose:

- ``"never"``: no loop is opened and every call is a plain ``await`` (pure Trio,
  the fastest; asyncio code fails as it would without trio_rl's help).
- ``"always"``: every user coroutine runs as an asyncio task (Trio-flavoured user
  code then fails: ``trio.sleep`` inside asyncio is an error).
- ``"auto"`` (the default): per call, from what the object is. An explicit
  :func:`runs_on` marker wins; otherwise the module that defines the method
  decides: a module that imports trio is Trio, one that imports asyncio (or
  aiohttp, or anything from tinker_cookbook, or is part of tinker_cookbook)
  is asyncio, and one that imports neither runs natively on Trio. That last
  rule is a guess, and it is wrong for a method whose module imports none of
  these but which awaits an asyncio object defined elsewhere (an env ported to
  ``trio_rl.types`` whose ``step`` awaits a user-supplied asyncio grader): mark
  such a class with ``@runs_on("asyncio")`` or set ``asyncio_bridge="always"``.

Cancellation crosses both ways: cancelling the Trio caller throws one
``asyncio.CancelledError`` into the asyncio task (so ``gather``\\ ed children are
cancelled with it), and an asyncio exception reaches the Trio caller as itself.
When the run ends, the loop closes and cancels asyncio tasks that are still
running (``create_task`` without an ``await``).

Importing trio-asyncio patches asyncio for the process; trio_rl imports it only
when a run first bridges a call, and then restores plain ``asyncio.new_event_loop``
(see :func:`_import_trio_asyncio`), so the tinker SDK's own loop thread and
``asyncio.run`` elsewhere keep working.

Time: the loop's clock is Trio's, so ``asyncio.sleep`` and asyncio timeouts follow
``trio.testing.MockClock`` (autojump included). Thread-based asyncio calls
(``asyncio.to_thread``, ``run_in_executor``) do not: a thread in flight is not
activity for autojump, as for Trio's own threads.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import sys
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

import sniffio
import trio
from tinker import types as tinker_types

from .backends.protocol import SamplingClient

if TYPE_CHECKING:
    import trio_asyncio

BridgeMode = Literal["auto", "always", "never"]
"""How user coroutines are run: see the module docstring."""

BRIDGE_MODES: tuple[str, ...] = get_args(BridgeMode)

Flavour = Literal["trio", "asyncio"]
"""The async library a coroutine function was written for."""

T = TypeVar("T")
C = TypeVar("C")

_MARKER = "__trio_rl_flavour__"
# Imported by a module (or naming the module itself), these make its
# coroutines asyncio-flavoured: aiohttp only works on a running asyncio loop,
# and code written for tinker-cookbook is asyncio code throughout, including
# methods that only await other cookbook objects (a completer, a grader).
_ASYNCIO_MODULES = ("asyncio", "aiohttp", "tinker_cookbook")


def runs_on(flavour: Flavour) -> Callable[[C], C]:
    """Mark a class or coroutine function as written for ``flavour``; ``"auto"`` obeys the mark.

    Use it where auto's guess from the module is wrong, e.g. on an env whose
    module imports nothing but which awaits an asyncio object::

        @runs_on("asyncio")
        class MyEnv(Env): ...
    """
    if flavour not in get_args(Flavour):
        raise ValueError(f"runs_on() takes 'trio' or 'asyncio', not {flavour!r}")

    def mark(obj: C) -> C:
        setattr(obj, _MARKER, flavour)
        return obj

    return mark


def _is_from(value: object, names: tuple[str, ...]) -> bool:
    if isinstance(value, types.ModuleType):
        name = value.__name__
    else:
        name = getattr(value, "__module__", None) or ""
        if not isinstance(name, str):
            return False
    return any(name == n or name.startswith(n + ".") for n in names)


@functools.cache
def _module_flavour(module_name: str) -> Flavour | None:
    """What a module's imports say about its coroutines (None: neither library)."""
    if _is_from(types.ModuleType(module_name), _ASYNCIO_MODULES):
        return "asyncio"
    module = sys.modules.get(module_name)
    if module is None:
        return None
    values = list(vars(module).values())
    # A module that imports both (one that bridges by hand) is taken at its
    # Trio word: its asyncio use is already wrapped.
    if any(_is_from(v, ("trio",)) for v in values):
        return "trio"
    if any(_is_from(v, _ASYNCIO_MODULES) for v in values):
        return "asyncio"
    return None


def flavour_of(fn: Callable[..., Any]) -> Flavour:
    """The domain ``"auto"`` runs ``fn`` in: its :func:`runs_on` mark, else its module's imports.

    ``fn`` is a coroutine function, a bound method, or an object with an async
    ``__call__``. Neither library imported means Trio (see the module docstring).
    The answer is cached per function and owner class (marks go on classes and
    functions, not on instances).
    """
    func = getattr(fn, "__func__", None)
    key = (
        (func, type(getattr(fn, "__self__", None)))
        if func is not None
        else (fn if inspect.isfunction(fn) else type(fn), None)
    )
    try:
        return _FLAVOURS[key]
    except KeyError:
        pass
    except TypeError:  # unhashable: judge it afresh
        return _judge(fn)
    flavour = _FLAVOURS[key] = _judge(fn)
    return flavour


_FLAVOURS: dict[tuple[Any, Any], Flavour] = {}


def _judge(fn: Callable[..., Any]) -> Flavour:
    owner = getattr(fn, "__self__", None)
    for holder in (fn, getattr(fn, "__func__", None), type(owner) if owner is not None else None):
        mark = getattr(holder, _MARKER, None) if holder is not None else None
        if mark is not None:
            return mark  # type: ignore[no-any-return]
    target = getattr(fn, "__func__", fn)
    if not inspect.isfunction(target):
        # A callable object (an evaluator): its class's mark, or its class's __call__, says.
        mark = getattr(type(fn), _MARKER, None)
        if mark is not None:
            return mark  # type: ignore[no-any-return]
        target = type(fn).__call__ if callable(fn) else target
    target = inspect.unwrap(target)
    return _module_flavour(getattr(target, "__module__", "") or "") or "trio"


@functools.cache
def _import_trio_asyncio() -> types.ModuleType:
    """Import trio-asyncio, once, and give plain loop creation back to everyone else.

    Importing trio-asyncio replaces ``asyncio.new_event_loop`` for the whole
    process: afterwards a thread that makes itself a loop (the tinker SDK's
    request thread, ``asyncio.run`` anywhere) gets a trio-asyncio "sync loop",
    and one made from a Trio task raises. trio_rl's bridge never makes loops
    that way (``open_loop`` builds its own), so the stock behaviour is put
    back: ``new_event_loop`` makes a loop of the policy in force before the
    import. Everything trio-asyncio needs to run asyncio inside Trio (its
    ``get_running_loop`` and policy lookups) stays as it installed it.
    """
    import trio_asyncio
    import trio_asyncio._loop as trio_asyncio_loop

    original_policy = getattr(trio_asyncio_loop, "_original_policy", None) or asyncio.DefaultEventLoopPolicy()

    def new_event_loop() -> asyncio.AbstractEventLoop:
        return original_policy.new_event_loop()

    asyncio.new_event_loop = new_event_loop
    asyncio.events.new_event_loop = new_event_loop
    module: types.ModuleType = trio_asyncio
    return module


class UserCodeRunner:
    """Calls user coroutines in the domain they need, on one run's asyncio loop.

    Get one from :func:`open_user_code_runner`; trio_rl's stages reach the
    current one through :func:`call_user` and :func:`call_evaluator`.

    Args:
        mode: see :data:`BridgeMode`.
        nursery: where the asyncio loop's task runs, opened at the first call
            that needs it (None for ``"never"``).
    """

    def __init__(self, mode: BridgeMode, nursery: trio.Nursery | None) -> None:
        if mode != "never" and nursery is None:
            raise ValueError(f"asyncio_bridge={mode!r} needs a nursery to run its asyncio loop in")
        self.bridge_mode = mode
        self._nursery = nursery
        self._loop: trio_asyncio.TrioEventLoop | None = None
        self._opening = trio.Lock()
        self._closed = trio.Event()
        self.bridged_calls = 0
        """How many calls ran as asyncio tasks."""

    def flavour(self, fn: Callable[..., Any]) -> Flavour:
        """Where this runner would run ``fn``."""
        if self.bridge_mode == "never":
            return "trio"
        if self.bridge_mode == "always":
            return "asyncio"
        return flavour_of(fn)

    def call(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
        """What to await for ``fn(*args, **kwargs)`` in ``fn``'s domain; exceptions propagate as themselves.

        A Trio call returns ``fn``'s own coroutine (no wrapper, so the native
        path costs one lookup); an asyncio one returns a Trio coroutine that
        runs it as an asyncio task on the run's loop.

        Raises (when awaited):
            trio.Cancelled: when the caller is cancelled; an asyncio task being
                run gets ``asyncio.CancelledError`` first.
            RuntimeError: for an asyncio call after the run's stages ended.
        """
        if self.bridge_mode == "never" or self.flavour(fn) == "trio":
            return fn(*args, **kwargs)
        return self._bridged(fn, *args, **kwargs)

    def bind(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        """``fn`` itself if it runs natively, else a function that runs it on the loop.

        The decision for a method that is called many times (``env.step``) is
        then made once per rollout, and the native path costs nothing per call.
        """
        if self.bridge_mode == "never" or self.flavour(fn) == "trio":
            return fn
        return functools.partial(self._bridged, fn)

    async def _bridged(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        loop = await self._open_loop()
        self.bridged_calls += 1
        trio_asyncio = _import_trio_asyncio()
        # aio_as_trio(fn)(...) creates the coroutine inside the asyncio task, so
        # even its first line runs with a running asyncio loop.
        return await trio_asyncio.aio_as_trio(fn, loop=loop)(*args, **kwargs)  # type: ignore[no-any-return]

    def trio_from_asyncio(self, method: Callable[..., Awaitable[T]], *args: Any) -> Awaitable[T]:
        """What an asyncio task on this runner's loop awaits to run the Trio coroutine ``method(*args)``."""
        trio_asyncio = _import_trio_asyncio()
        # The running loop, not trio-asyncio's context variable: that one is set
        # only in the task that opened the loop, not in tasks user code spawns.
        return trio_asyncio.trio_as_aio(method, loop=asyncio.get_running_loop())(*args)  # type: ignore[no-any-return]

    async def call_evaluator(self, evaluator: Callable[[Any], Awaitable[T]], client: SamplingClient) -> T:
        """Run ``evaluator(client)``; a bridged evaluator gets a :class:`DualSamplingClient`."""
        if self.bridge_mode == "never" or self.flavour(evaluator) == "trio":
            return await evaluator(client)
        return await self._bridged(evaluator, DualSamplingClient.wrap(client))

    async def _open_loop(self) -> trio_asyncio.TrioEventLoop:
        async with self._opening:
            if self._closed.is_set():
                raise RuntimeError("this run's asyncio loop is closed: its stages have ended")
            if self._loop is None:
                assert self._nursery is not None
                self._loop = await self._nursery.start(self._serve_loop)
        return self._loop

    async def _serve_loop(self, *, task_status: trio.TaskStatus[trio_asyncio.TrioEventLoop]) -> None:
        # Shielded: a cancelled run still runs its envs' shielded cleanups, and
        # asyncio ones need the loop until then. The loop ends at close(), which
        # open_user_code_runner calls once every stage has ended; asyncio calls
        # in flight are cancelled by their own Trio callers' cancellation.
        with trio.CancelScope(shield=True):
            async with _import_trio_asyncio().open_loop() as loop:
                task_status.started(loop)
                await self._closed.wait()

    def close(self) -> None:
        """Let the loop's task end (closing the loop cancels asyncio tasks still running)."""
        self._closed.set()


_NATIVE = UserCodeRunner("never", None)
_current_runner: ContextVar[UserCodeRunner] = ContextVar("trio_rl_user_code_runner", default=_NATIVE)

RunnerFactory = Callable[[BridgeMode, trio.Nursery], UserCodeRunner]
"""Makes a run's :class:`UserCodeRunner` from its mode and the nursery its helpers run in."""

runner_factory: ContextVar[RunnerFactory] = ContextVar("trio_rl_runner_factory", default=UserCodeRunner)
"""How :func:`open_user_code_runner` makes a run's runner: by default one that opens its own
trio-asyncio loop; :mod:`trio_rl.cookbook` sets one that runs asyncio calls on the host loop
of a Trio guest run. Set it in the context the run starts from."""


def current_runner() -> UserCodeRunner:
    """The runner of the run this task belongs to (a pure-Trio one outside any run)."""
    return _current_runner.get()


def call_user(fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
    """``await call_user(fn, ...)`` calls a user coroutine through the current run's :class:`UserCodeRunner`."""
    return _current_runner.get().call(fn, *args, **kwargs)


async def call_evaluator(evaluator: Callable[[Any], Awaitable[T]], client: SamplingClient) -> T:
    """Call an evaluator through the current run's :class:`UserCodeRunner`."""
    return await _current_runner.get().call_evaluator(evaluator, client)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _leaves(sub)]
    return [exc]


def _same_leaves(a: BaseException, b: BaseException) -> bool:
    # Trio's cancel scope rebuilds (splits) a group on its way out, so the body's
    # group comes back as an equal copy holding the very same leaf exceptions.
    leaves_a, leaves_b = _leaves(a), _leaves(b)
    return len(leaves_a) == len(leaves_b) and all(x is y for x, y in zip(leaves_a, leaves_b, strict=True))


@asynccontextmanager
async def open_user_code_runner(mode: BridgeMode) -> AsyncIterator[UserCodeRunner]:
    """Make a runner current for the tasks started inside; it owns the run's asyncio loop.

    Enter it in the run's task around the nursery that runs the stages
    (``async with open_user_code_runner(mode), trio.open_nursery() as nursery:``):
    tasks started inside inherit the runner, and the loop, opened at the first
    call that needs it, closes once every stage (the evaluator included) has
    ended, cancelling asyncio tasks that user code left running. An exception
    from the body comes out as itself, not wrapped in another group.

    Raises:
        ValueError: for a mode that is not one of :data:`BRIDGE_MODES`.
    """
    if mode not in BRIDGE_MODES:
        raise ValueError(f"asyncio_bridge must be one of {', '.join(BRIDGE_MODES)}, not {mode!r}")
    if mode == "never":
        token = _current_runner.set(_NATIVE)
        try:
            yield _NATIVE
        finally:
            _current_runner.reset(token)
        return
    body_error: BaseException | None = None
    unwrap = False
    try:
        async with trio.open_nursery() as loop_nursery:
            runner = runner_factory.get()(mode, loop_nursery)
            token = _current_runner.set(runner)
            try:
                yield runner
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                _current_runner.reset(token)
                runner.close()
    except BaseExceptionGroup as group:
        # The nursery wraps the body's own exception in a group of one. When that
        # is all there is (the loop's task did not fail), hand the body's
        # exception on as itself: train() raises the same group with or without
        # the bridge. Anything else is a real second failure and stays grouped.
        if body_error is None or len(group.exceptions) != 1 or not _same_leaves(group.exceptions[0], body_error):
            raise
        unwrap = True
    if unwrap:
        assert body_error is not None
        raise body_error


def _in_asyncio() -> bool:
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False


class DualSamplingClient:
    """A trio_rl sampling client that Trio and asyncio code can both await.

    Each method returns what the calling domain can await: from Trio, the
    wrapped client's coroutine; from an asyncio task on trio_rl's loop, an
    asyncio future that runs it in Trio (``trio_asyncio.trio_as_aio``). It has
    trio_rl's names and the tinker SDK's (``sample_async``,
    ``compute_logprobs_async``), so cookbook completers and evaluators written
    against ``tinker.SamplingClient`` use it unchanged. Other attributes are
    the wrapped client's.

    Args:
        client: the trio_rl sampling client.
    """

    def __init__(self, client: SamplingClient) -> None:
        self._client = client

    @classmethod
    def wrap(cls, client: SamplingClient) -> DualSamplingClient:
        """``client`` itself if it is already dual, else a wrapper around it."""
        return client if isinstance(client, DualSamplingClient) else cls(client)

    @property
    def wrapped(self) -> SamplingClient:
        """The trio_rl client underneath."""
        return self._client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def _dispatch(self, method: Callable[..., Awaitable[T]], *args: Any) -> Awaitable[T]:
        if _in_asyncio():
            return _current_runner.get().trio_from_asyncio(method, *args)
        return method(*args)

    def sample(
        self,
        prompt: tinker_types.ModelInput,
        num_samples: int,
        sampling_params: tinker_types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> Awaitable[tinker_types.SampleResponse]:
        """Sample ``num_samples`` continuations (the prompt-logprob options are not supported).

        Raises:
            NotImplementedError: if prompt logprobs are asked for.
        """
        if include_prompt_logprobs or topk_prompt_logprobs:
            raise NotImplementedError("trio_rl sampling clients do not return prompt logprobs from sample()")
        return self._dispatch(self._client.sample, prompt, num_samples, sampling_params)

    async def sample_async(
        self,
        prompt: tinker_types.ModelInput,
        num_samples: int,
        sampling_params: tinker_types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> tinker_types.SampleResponse:
        """The tinker SDK's name for :meth:`sample`."""
        return await self.sample(prompt, num_samples, sampling_params, include_prompt_logprobs, topk_prompt_logprobs)

    def compute_logprobs(self, prompt: tinker_types.ModelInput) -> Awaitable[list[float | None]]:
        """Score ``prompt``: each token's logprob given those before it (None first)."""
        return self._dispatch(self._client.compute_logprobs, prompt)

    async def compute_logprobs_async(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        """The tinker SDK's name for :meth:`compute_logprobs`."""
        return await self.compute_logprobs(prompt)

    def __repr__(self) -> str:
        return f"DualSamplingClient({self._client!r})"


__all__ = [
    "BRIDGE_MODES",
    "BridgeMode",
    "DualSamplingClient",
    "Flavour",
    "RunnerFactory",
    "UserCodeRunner",
    "call_evaluator",
    "call_user",
    "current_runner",
    "flavour_of",
    "open_user_code_runner",
    "runner_factory",
    "runs_on",
]
