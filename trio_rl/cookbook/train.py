"""The drop-in for tinker-cookbook 0.6.1's ``tinker_cookbook.rl.train``.

In a recipe, ``from tinker_cookbook.rl.train import AsyncConfig, Config, StreamMinibatchConfig, main``
becomes ``from trio_rl.cookbook.train import ...`` and nothing else changes: the recipe builds the
same chz ``Config`` and calls ``asyncio.run(main(config))``, which trains with trio_rl's loop.

Design: ``main`` is a coroutine of the recipe's own asyncio loop, and runs trio_rl as a Trio guest
of that loop (:func:`trio_rl.cookbook.host_loop.run_as_guest`). The recipe's envs, graders and
evaluators then run as tasks of a real, running asyncio loop, the one they were written for, while
the loop's stages are Trio tasks in one nursery: no second loop inside Trio (trio-asyncio), no
thread. Every field is read as :mod:`trio_rl.cookbook.fields` says, and anything trio_rl cannot
honour is refused before the dataset is built or any backend is called.

The backend is ``TinkerBackend(base_url=config.base_url)`` unless ``main`` is given one, or a recipe
that calls ``main(config)`` runs inside :func:`use_backend`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import chz
from tinker_cookbook.rl.train import Config, KLReferenceConfig, StreamMinibatchConfig

from .. import config as native
from ..backends.protocol import Backend
from ..errors import ConfigError
from ..loop.evaluation import SamplingClientEvaluator
from ..loop.train import TrainResult, train
from ..rl.test_set import RLTestSetEvaluator
from ..types import RLDataset
from .fields import has_checkpoints, native_config, steps_ahead
from .host_loop import run_as_guest

__all__ = ["AsyncConfig", "Config", "KLReferenceConfig", "StreamMinibatchConfig", "main", "use_backend"]

BackendChoice = Backend | Callable[[Any], Backend]
"""A backend (not yet entered), or a function that makes one from the cookbook Config."""

_chosen_backend: ContextVar[BackendChoice | None] = ContextVar("trio_rl_cookbook_backend", default=None)


@chz.chz
class AsyncConfig:
    """tinker-cookbook 0.6.1's ``AsyncConfig``, which also takes the newer name ``sampling_steps_ahead``.

    Attributes:
        groups_per_batch: groups per training step.
        max_steps_off_policy: how many steps sampling may run ahead of training (K).
        loss_fn: the loss async runs train with (default ``"stable_reinforce"``, as 0.6.1).
        sampling_steps_ahead: K under the name tinker-cookbook's main branch gives it; giving
            both names with different values is an error.
    """

    groups_per_batch: int
    max_steps_off_policy: int | None = None
    loss_fn: str = "stable_reinforce"
    sampling_steps_ahead: int | None = None

    # chz is untyped in .ci/lint's venv (a decorator of Any) and typed in the cookbook suite's.
    @chz.validate  # type: ignore[untyped-decorator, unused-ignore]
    def _check(self) -> None:
        k = steps_ahead(self)
        if k < 0 or self.groups_per_batch < 1:
            raise ConfigError(
                "async_config",
                f"AsyncConfig needs max_steps_off_policy >= 0 and groups_per_batch >= 1, got {k} and "
                f"{self.groups_per_batch}",
            )


@contextmanager
def use_backend(backend: BackendChoice) -> Iterator[None]:
    """Run every :func:`main` called inside (a recipe's own ``main(config)``) on ``backend``.

    Args:
        backend: a backend not yet entered, or a function that makes one from the cookbook Config
            (for example ``lambda config: HFBackend(log_dir=config.log_path)``).
    """
    token = _chosen_backend.set(backend)
    try:
        yield
    finally:
        _chosen_backend.reset(token)


async def main(config: Any, rollout_executor: Any = None, *, backend: BackendChoice | None = None) -> TrainResult:
    """Train as tinker-cookbook 0.6.1's ``rl.train.main(config)`` does, on trio_rl's loop.

    Args:
        config: the cookbook's ``Config`` (from ``tinker_cookbook.rl.train`` or this module).
        rollout_executor: 0.6.1's executor for rollouts in other processes; only None is supported.
        backend: where to train; default: the one :func:`use_backend` chose, else
            ``TinkerBackend(base_url=config.base_url)``.

    Returns:
        trio_rl's result of the run (0.6.1's ``main`` returns None).

    Raises:
        ConfigError: before any work, for a field trio_rl cannot honour (one line naming it).
        ExceptionGroup: a failure once training has started (see :func:`trio_rl.train`).
    """
    if rollout_executor is not None:
        raise ConfigError("rollout_executor", "trio_rl runs rollouts in-process only; pass None")
    choice = backend if backend is not None else _chosen_backend.get()
    if choice is not None and config.base_url is not None:
        raise ConfigError("base_url", "the URL is for the Tinker backend, and another backend was given")
    run_config = native_config(config, resume=has_checkpoints(config.log_path))
    run_config.validate()
    dataset, test_dataset = await config.dataset_builder()
    evaluators = _evaluators(config, run_config, test_dataset)
    chosen = _make_backend(choice, config)
    return await run_as_guest(_train, run_config, dataset, chosen, evaluators)


async def _train(
    config: native.Config, dataset: RLDataset, backend: Backend, evaluators: Sequence[SamplingClientEvaluator]
) -> TrainResult:
    async with backend:
        return await train(config, dataset=dataset, backend=backend, evaluators=evaluators)


def _evaluators(
    config: Any, run_config: native.Config, test_dataset: RLDataset | None
) -> list[SamplingClientEvaluator]:
    """0.6.1's evaluators: one from each builder, and the test set's; none at all when ``eval_every`` is 0."""
    evaluators: list[SamplingClientEvaluator] = [build() for build in config.evaluator_builders]
    if test_dataset is not None:
        strategy = run_config.rollout_strategy()
        evaluators.append(RLTestSetEvaluator(test_dataset, max_tokens=config.max_tokens, strategy=strategy))
    # trio_rl evaluates the final weights at eval_every=0; 0.6.1 then evaluates nothing.
    return evaluators if config.eval_every > 0 else []


def _make_backend(choice: BackendChoice | None, config: Any) -> Backend:
    if choice is None:
        from ..backends.tinker import TinkerBackend

        return TinkerBackend(base_url=config.base_url)
    if hasattr(choice, "create_training_client"):
        return choice  # type: ignore[return-value]
    return choice(config)
