"""post_update_kl: tinker-cookbook 0.6.1's compute_post_kl metrics, checked against hand-computed values."""

from __future__ import annotations

import pytest
from tinker import types as tinker_types

from tests.test_kl_penalty import datum
from trio_rl.rl.kl import post_update_kl


class ScoringClient:
    """Scores each sequence with fixed logprobs, keyed by its tokens."""

    def __init__(self, scores: dict[tuple[int, ...], list[float | None]]) -> None:
        self.scores = scores
        self.model_path = None

    async def sample(self, *args: object) -> tinker_types.SampleResponse:
        raise AssertionError("post_update_kl scores; it does not sample")

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        return self.scores[tuple(prompt.to_ints())]


async def test_post_update_kl_averages_over_action_tokens() -> None:
    a = datum([1, 2, 3], [-0.5, -1.0], [0.0, 0.5], [0.0, 1.0])
    b = datum([1, 4, 5, 6], [-9.0, -2.0, -1.0], [0.0, -0.5, -0.5], [0.0, 1.0, 1.0])
    client = ScoringClient({(1, 2, 3): [None, -0.1, -1.5], (1, 4, 5, 6): [None, -7.0, -2.25, -0.5]})
    metrics = await post_update_kl(client, [a, b])  # type: ignore[arg-type]
    # Action-token diffs, sampled minus new: -1.0 - -1.5, -2.0 - -2.25, -1.0 - -0.5; prompt tokens do not count.
    diffs = [0.5, 0.25, -0.5]
    assert metrics["kl_pre_post_v1"] == pytest.approx(sum(diffs) / 3)
    assert metrics["kl_pre_post_v2"] == pytest.approx(0.5 * sum(d * d for d in diffs) / 3)


async def test_post_update_kl_of_data_without_actions_is_empty() -> None:
    a = datum([1, 2, 3], [-0.5, -1.0], [0.0, 0.0], [0.0, 0.0])
    assert await post_update_kl(ScoringClient({(1, 2, 3): [None, -0.1, -1.5]}), [a]) == {}  # type: ignore[arg-type]
