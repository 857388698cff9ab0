"""Cookbook env modules ported by switching their ``tinker_cookbook.rl.types`` imports to ``trio_rl.types``.

Each module is the installed cookbook's own source with exactly that import
line rewritten and nothing else changed; it is loaded from a temporary file
and trained through trio_rl.train.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from pathlib import Path

import pytest
import tinker_cookbook
from tinker_cookbook.recipes.rubric.data import Rubric, RubricBasedDatapoint

import trio_rl.types
from tests.cookbook.cookbook_fixtures import (
    MODE_NAMES,
    RENDERER,
    AsyncioAnswerer,
    ScoringGrader,
    run_training,
)

COOKBOOK_IMPORT = "from tinker_cookbook.rl.types import"
TRIO_RL_IMPORT = "from trio_rl.types import"

MODULES = {
    "guess_number": "recipes/multiplayer_rl/guess_number/env.py",
    "twenty_questions": "recipes/multiplayer_rl/twenty_questions/env.py",
    "rubric": "recipes/rubric/env.py",
}


def port(name: str, tmp_path: Path) -> types.ModuleType:
    """Load the cookbook module ``name`` with its rl.types import switched to trio_rl.types."""
    source = (Path(inspect.getfile(tinker_cookbook)).parent / MODULES[name]).read_text()
    assert source.count(COOKBOOK_IMPORT) == 1, "the module no longer imports tinker_cookbook.rl.types this way"
    ported = source.replace(COOKBOOK_IMPORT, TRIO_RL_IMPORT)
    assert "tinker_cookbook.rl.types" not in ported and "tinker_cookbook.rl import types" not in ported
    path = tmp_path / f"ported_{name}.py"
    path.write_text(ported)
    spec = importlib.util.spec_from_file_location(f"ported_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_ported_guess_number(tmp_path: Path, mode: str) -> None:
    module = port("guess_number", tmp_path)
    assert issubclass(module.GuessNumberEnv, trio_rl.types.Env)
    assert issubclass(module.GuessNumberDatasetBuilder, trio_rl.types.RLDatasetBuilder)
    dataset = module.GuessNumberDataset(answers=[1, 2, 3, 4], renderer=RENDERER, batch_size=2, group_size=2)
    result = run_training(tmp_path / "run", mode, dataset, 2)
    assert result.final_step == 2 and result.trained_groups == 4
    # StepResult(logs=...) from the env reached the transitions; GuessNumber plays up to 10 turns.
    assert result.step_metrics[0]["env/all/turns_per_episode"] > 1


def test_ported_guess_number_runs_as_pure_trio(tmp_path: Path) -> None:
    module = port("guess_number", tmp_path)
    dataset = module.GuessNumberDataset(answers=[5, 6], renderer=RENDERER, batch_size=2, group_size=2)
    result = run_training(tmp_path / "run", "sync", dataset, 2, asyncio_bridge="never")
    assert result.final_step == 1


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_ported_twenty_questions_with_an_asyncio_answerer(tmp_path: Path, mode: str) -> None:
    module = port("twenty_questions", tmp_path)
    answerer = AsyncioAnswerer()
    dataset = module.TwentyQuestionsDataset(
        answerer=answerer, answers=["apple", "stone"], renderer=RENDERER, batch_size=2, group_size=2
    )
    result = run_training(tmp_path / "run", mode, dataset, 2)
    assert result.final_step == 1 and answerer.calls >= 4


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_ported_rubric_env(tmp_path: Path, mode: str) -> None:
    module = port("rubric", tmp_path)
    assert issubclass(module.RubricGradedEnv, trio_rl.types.Env)
    grader = ScoringGrader()
    datapoints = [RubricBasedDatapoint(convo=[{"role": "user", "content": "Say hi."}], rubric_items=[Rubric("Polite?")])] * 4
    dataset = module.RubricGradedDataset(renderer=RENDERER, batch_size=2, group_size=2, datapoints=datapoints, grader_llm=grader)
    result = run_training(tmp_path / "run", mode, dataset, 2)
    assert result.final_step == 2 and grader.calls == 8
