"""Real tinker-cookbook 0.6.1 recipe modules, with their one ``rl.train`` import rewritten to trio_rl.cookbook.train.

Each recipe's source is loaded from the installed cookbook, the import line that
names ``tinker_cookbook.rl.train`` is replaced by the same line naming
``trio_rl.cookbook.train``, and the module then runs as its ``__main__`` would:
build the chz Config, ``asyncio.run(main(config))``. The model is a tiny Qwen3
built on disk (tests/integration/tiny_model.py), trained by HFBackend; the
recipe's dataset builder loads its tokenizer from that folder. Nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import chz
import pytest
import tinker_cookbook

from tests.integration.tiny_model import TinyModel
from trio_rl.backends import HFBackend, HFModelSettings
from trio_rl.cookbook import train as drop_in

IMPORTS = {
    "from tinker_cookbook.rl.train import": "from trio_rl.cookbook.train import",
    "from tinker_cookbook.rl import train\n": "from trio_rl.cookbook import train\n",
}

RUN_TIMEOUT_S = 300.0


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel) -> str:
    """A copy of the tiny model (tests/conftest.py) that says it takes 4096 positions: multi-turn
    prompts outgrow the 512 it is built with; its rotary embeddings go further."""
    path = tmp_path_factory.mktemp("models") / "tiny" / "qwen3"
    shutil.copytree(tiny_model.path, path)
    config_file = path / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "max_position_embeddings": 4096}))
    return str(path)


def load_recipe(relative: str, tmp_path: Path) -> types.ModuleType:
    """The cookbook module at ``relative`` with its one rl.train import rewritten (and nothing else)."""
    source = (Path(inspect.getfile(tinker_cookbook)).parent / relative).read_text()
    found = [old for old in IMPORTS if old in source]
    assert len(found) == 1 and source.count(found[0]) == 1, "the recipe no longer imports rl.train this way"
    ported = source.replace(found[0], IMPORTS[found[0]])
    assert "tinker_cookbook.rl.train" not in ported and "tinker_cookbook.rl import train" not in ported
    name = "ported_" + relative.replace("/", "_").removesuffix(".py")
    path = tmp_path / f"{name}.py"
    path.write_text(ported)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def hf_backend(config: Any) -> HFBackend:
    return HFBackend(
        log_dir=Path(config.log_path) / "backend", num_threads=1, model=HFModelSettings(device="cpu", dtype="float32")
    )


def run_main(coroutine: Any) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coroutine, RUN_TIMEOUT_S)

    with drop_in.use_backend(hf_backend):
        return asyncio.run(bounded())


def records(log_path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def arithmetic_cli(recipe: types.ModuleType, log_path: Path, **fields: Any) -> Any:
    """``recipes/math_rl``'s CLIConfig for two tiny arithmetic steps, saved every step, into ``log_path``."""
    small = {
        "renderer_name": "role_colon",
        "env": "arithmetic",
        "group_size": 2,
        "groups_per_batch": 2,
        "max_tokens": 4,
        "learning_rate": 1e-3,
        "loss_fn": "importance_sampling",
        "max_steps": 2,
        "eval_every": 0,
        "save_every": 1,
        "log_path": str(log_path),
        "behavior_if_log_dir_exists": "raise",
    }
    return recipe.CLIConfig(**{**small, **fields})


def test_math_rl_arithmetic_recipe_trains_through_the_drop_in(tmp_path: Path, long_context_model: str) -> None:
    recipe = load_recipe("recipes/math_rl/train.py", tmp_path)
    assert recipe.main is drop_in.main and recipe.AsyncConfig is drop_in.AsyncConfig
    log_path = tmp_path / "run"
    cli = arithmetic_cli(recipe, log_path, model_name=long_context_model, lora_rank=4)
    run_main(recipe.cli_main(cli))  # the recipe's cli_main returns None, as 0.6.1's main does
    steps = [r for r in records(log_path) if "progress/groups" in r]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(r["progress/groups"] == 2 and "env/all/reward/total" in r for r in steps)
    rows = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert [r["name"] for r in rows][-1] == "final"


def test_math_rl_async_recipe_trains_through_the_drop_in(tmp_path: Path, long_context_model: str) -> None:
    recipe = load_recipe("recipes/math_rl/train.py", tmp_path)
    log_path = tmp_path / "run"
    cli = recipe.CLIConfig(
        model_name=long_context_model,
        renderer_name="role_colon",
        group_size=2,
        groups_per_batch=2,
        max_tokens=4,
        loss_fn="importance_sampling",
        lora_rank=4,
        max_steps=2,
        max_steps_off_policy=1,
        eval_every=0,
        save_every=0,
        log_path=str(log_path),
        behavior_if_log_dir_exists="raise",
    )
    run_main(recipe.cli_main(cli))
    assert [r["step"] for r in records(log_path) if "progress/groups" in r] == [0, 1]
    assert json.loads((log_path / "config.json").read_text())["async_config"]["max_steps_off_policy"] == 1


def test_guess_number_multi_turn_recipe_trains_and_evaluates_its_test_set(
    tmp_path: Path, long_context_model: str
) -> None:
    recipe = load_recipe("recipes/multiplayer_rl/guess_number/train.py", tmp_path)
    assert recipe.train is drop_in
    log_path = tmp_path / "run"
    cli = recipe.CLIConfig(
        model_name=long_context_model,
        renderer_name="role_colon",
        group_size=2,
        batch_size=2,
        max_tokens=4,
        eval_every=2,
        save_every=0,
        max_steps=2,
        log_path=str(log_path),
    )
    config = recipe.build_config(cli)
    # The recipe's test set is 103 numbers x 4 games of up to ten turns: too slow on a CPU. Three games
    # keep the test set evaluated (the recipe module itself is unchanged).
    builder = chz.replace(config.dataset_builder, train_fraction=1021 / 1024, test_group_size=1)
    run_main(recipe.train.main(chz.replace(config, dataset_builder=builder)))
    written = records(log_path)
    steps = [r for r in written if "progress/groups" in r]
    assert [r["step"] for r in steps] == [0, 1]
    # Up to ten guesses per game: a game that lasts more than one turn shows the env is multi-turn.
    assert max(r["env/all/turns_per_episode"] for r in steps) > 1
    # The builder's test set (0.6.1 evaluates it as RLTestSetEvaluator under "test/").
    assert any("test/env/all/reward/total" in r for r in written)
