"""The cookbook's training semantics against the real tinker-cookbook 0.6.1: checkpoint rows both ways,
metric keys on the cookbook's own env, and retries of a cookbook builder (which has no ``make_env``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tinker_cookbook import checkpoint_utils
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset
from tinker_cookbook.rl.metric_util import RLTestSetEvaluator

from bench.cookbook_keys import COOKBOOK_KEYS, compare
from tests.cookbook.cookbook_fixtures import RENDERER, TOKENIZER, run_training
from trio_rl import RetryOnFailure
from trio_rl.testing import FakeBackend, FakeSamplerModel

TOKEN_KINDS = {"sampled", "prefill_cached", "prefill_uncached", "trained"}


def test_get_last_checkpoint_reads_a_trio_rl_run(tmp_path: Path) -> None:
    dataset = ArithmeticDataset(batch_size=2, renderer=RENDERER, group_size=2, n_batches=4)
    run_training(tmp_path, "sync", dataset, 2, save_every=2)
    record = checkpoint_utils.get_last_checkpoint(str(tmp_path))
    assert record is not None and record.name == "final" and record.final is True
    assert record.batch == 4 and record.state_path and record.sampler_path
    assert set(record.extra["cumulative_tokens"]) == TOKEN_KINDS
    sampler = checkpoint_utils.get_last_checkpoint(str(tmp_path), required_key="sampler_path")
    assert sampler is not None and sampler.sampler_path == record.sampler_path
    periodic = checkpoint_utils.load_checkpoints_file(str(tmp_path))[0]
    assert (periodic.name, periodic.batch, periodic.final) == ("000002", 2, False)


class _Saved:
    def __init__(self, path: str) -> None:
        self.path = path

    def __await__(self) -> Any:
        if False:  # an awaitable that is already done
            yield
        return self


class _CookbookTrainingClient:
    """Just what the cookbook's save_checkpoint_async calls."""

    def save_state(self, name: str, ttl_seconds: int | None = None) -> _Saved:
        return _Saved(f"fake://state/{name}")

    def save_weights_for_sampler(self, name: str, ttl_seconds: int | None = None) -> _Saved:
        return _Saved(f"fake://sampler/{name}")


def test_trio_rl_resumes_a_run_folder_the_cookbook_wrote(tmp_path: Path) -> None:
    loop_state = {
        "batch": 2,
        "cumulative_tokens": {"sampled": 10, "prefill_cached": 0, "prefill_uncached": 20, "trained": 30},
        "discarded_tokens": {"sampled": 0, "prefill_cached": 0, "prefill_uncached": 0, "trained": 0},
    }
    asyncio.run(
        checkpoint_utils.save_checkpoint_async(
            _CookbookTrainingClient(), "000002", str(tmp_path), loop_state, kind="both"
        )
    )
    (row,) = [json.loads(line) for line in (tmp_path / "checkpoints.jsonl").read_text().splitlines()]
    assert "cursor" not in row
    backend = FakeBackend(seed=0, record_calls=False, sampler=FakeSamplerModel(vocab_size=TOKENIZER.vocab_size))
    backend.states["fake://state/000002"] = 2  # the state the cookbook saved on its service
    dataset = ArithmeticDataset(batch_size=2, renderer=RENDERER, group_size=2, n_batches=4)
    result = run_training(tmp_path, "sync", dataset, 2, backend=backend, resume=True)
    assert [m["step"] for m in result.step_metrics] == [2, 3]
    first = result.step_metrics[0]
    assert first["tokens/cumulative/trained"] == 30 + first["tokens/trained"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_same_env_gives_the_cookbooks_keys_for_every_concept_trio_rl_measures(tmp_path: Path, mode: str) -> None:
    dataset = ArithmeticDataset(batch_size=2, renderer=RENDERER, group_size=3, n_batches=3)
    test_set = ArithmeticDataset(batch_size=2, renderer=RENDERER, group_size=2, n_batches=1)
    evaluator = RLTestSetEvaluator(test_set, max_tokens=8, name="test")
    result = run_training(tmp_path, mode, dataset, 2, evaluators=[evaluator], eval_every=1)
    ours = {key for record in result.metrics for key in record}
    comparison = compare(set(json.loads(COOKBOOK_KEYS.read_text())[mode]), ours)
    assert comparison["missing"] == []
    # The same env: its own metrics are shared too.
    assert comparison["env-defined"] == []
    assert {"env/all/correct", "env/all/format", "test/env/all/correct"} <= ours


def test_a_cookbook_builder_retries_through_make_envs(tmp_path: Path) -> None:
    # ProblemGroupBuilder has no make_env: the retry budget is spent through make_envs.
    dataset = ArithmeticDataset(batch_size=2, renderer=RENDERER, group_size=2, n_batches=2)
    result = run_training(tmp_path, "sync", dataset, 2, rollout_error_tolerance=RetryOnFailure(max_retries=1))
    assert result.trained_groups == 4


def test_the_cookbooks_default_cleanup_is_known_to_do_nothing() -> None:
    # Every group used to enter a shielded, deadlined scope to await the cookbook's
    # inherited no-op; a builder that overrides cleanup still gets one.
    from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
    from tinker_cookbook.rl.types import EnvGroupBuilder as CookbookEnvGroupBuilder

    from trio_rl.rl.rollouts import _cleanup_is_a_no_op

    class Releasing(ProblemGroupBuilder):
        async def cleanup(self) -> None:
            pass

    assert _cleanup_is_a_no_op(ProblemGroupBuilder)
    assert _cleanup_is_a_no_op(CookbookEnvGroupBuilder)
    assert not _cleanup_is_a_no_op(Releasing)
