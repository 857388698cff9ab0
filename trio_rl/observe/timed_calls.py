"""The calls a rollout makes each turn (a sample, an env step), timed as spans only where a run records them.

A rollout samples and steps its env once per turn, so a span around each,
even a do-nothing one, would cost every run. Instead a rollout of a run that
records spans calls its policy and its envs through these wrappers, and one
that does not calls them directly; the stall report names the same waits
either way (the rollout's ``# waits on:`` lines, :mod:`trio_rl.observe.waits`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, ParamSpec, Protocol, TypeVar

from .spans import span

T = TypeVar("T")
P = ParamSpec("P")


class UserCalls(Protocol):
    """How a rollout calls an env's coroutines: :class:`trio_rl.asyncio_bridge.UserCodeRunner`, or it timed."""

    def call(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> Awaitable[T]: ...

    def bind(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]: ...


class TimedUserCalls:
    """Calls env coroutines through ``runner``, each inside a span ``env_<method name>`` (``env_step``...)."""

    __slots__ = ("_runner",)

    def __init__(self, runner: UserCalls) -> None:
        self._runner = runner

    def call(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> Awaitable[T]:
        return _timed(_span_name(fn), self._runner.call(fn, *args, **kwargs))

    def bind(self, fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        bound, name = self._runner.bind(fn), _span_name(fn)

        def timed(*args: Any, **kwargs: Any) -> Awaitable[T]:
            return _timed(name, bound(*args, **kwargs))

        return timed


class TimedPolicy(Generic[P, T]):
    """A token policy whose every call is a ``sample`` span."""

    __slots__ = ("_policy",)

    def __init__(self, policy: Callable[P, Awaitable[T]]) -> None:
        self._policy = policy

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        with span("sample"):
            return await self._policy(*args, **kwargs)


def _span_name(fn: Callable[..., Any]) -> str:
    # An env's method may be any callable (a partial, an object with __call__): not every one has a name.
    return f"env_{getattr(fn, '__name__', 'call')}"


async def _timed(name: str, call: Awaitable[T]) -> T:
    with span(name):
        return await call
