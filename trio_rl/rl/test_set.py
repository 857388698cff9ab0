"""Test-set evaluation as tinker-cookbook's ``RLTestSetEvaluator``: roll out a held-out dataset, report ``test/...``."""

from __future__ import annotations

import trio
from tinker import types as tinker_types

from ..backends.protocol import SamplingClient
from ..base.determinism import derive_seed
from ..errors import GroupFailedError
from ..types import EnvGroupBuilder, RLDataset, TrajectoryGroup
from .metrics import trajectory_metrics
from .rollouts import ErrorStrategy, FailFast, ParamsPerCall, SamplingPolicy, TokenPolicy, do_group_rollout


class RLTestSetEvaluator:
    """Roll out every group of a held-out dataset on the weights given; metrics under ``<name>/env/...``.

    Use it as one of :func:`trio_rl.train`'s evaluators. Its keys are the
    cookbook's (``test/env/all/reward/total``, ...). Under a tolerant
    ``strategy`` a group that fails is left out, as in the cookbook.

    Args:
        dataset: the held-out dataset; its builders are made once, here.
        max_tokens: tokens per sampled action.
        name: the prefix of every key.
        strategy: what failed rollouts do (default :class:`FailFast`: the evaluation fails).
        temperature: sampling temperature.
        seed: every rollout's seed derives from it and the group's place, so
            each evaluation samples the same way.
    """

    def __init__(
        self,
        dataset: RLDataset,
        max_tokens: int,
        name: str = "test",
        strategy: ErrorStrategy | None = None,
        temperature: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.builders: list[EnvGroupBuilder] = [b for i in range(len(dataset)) for b in dataset.get_batch(i)]
        self.name = name
        self._params = ParamsPerCall(tinker_types.SamplingParams(max_tokens=max_tokens, temperature=temperature))
        self._strategy = strategy or FailFast()
        self._seed = seed

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        results: list[tuple[TrajectoryGroup, list[str]] | None] = [None] * len(self.builders)

        async def one(index: int, builder: EnvGroupBuilder) -> None:
            def policy_for(env_index: int, attempt: int) -> TokenPolicy:
                return SamplingPolicy(sampling_client, self._params, derive_seed(self._seed, index, env_index, attempt))

            try:
                group = await do_group_rollout(builder, policy_for, self._strategy)
            except GroupFailedError:
                if not self._strategy.catches_group_errors:
                    raise
                return
            results[index] = (group, list(builder.logging_tags()))

        async with trio.open_nursery() as nursery:
            for index, builder in enumerate(self.builders):
                nursery.start_soon(one, index, builder)
        kept = [r for r in results if r is not None]
        metrics = trajectory_metrics([g for g, _ in kept], [t for _, t in kept])
        return {f"{self.name}/{key}": float(value) for key, value in metrics.items()}
