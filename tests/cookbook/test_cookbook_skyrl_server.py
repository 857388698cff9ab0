"""A real tinker-cookbook 0.6.1 recipe, its one import rewritten, against a real Tinker-compatible server.

The recipe is ``recipes/math_rl/train.py`` (arithmetic), loaded as test_cookbook_drop_in.py loads it,
and run as its ``__main__`` would, with only ``base_url`` and ``model_name`` pointed at the server:
``trio_rl.cookbook.train.main`` then trains on its default backend, ``TinkerBackend(base_url=...)``,
through the tinker SDK 0.38.0 of this venv.

The server is SkyRL 0.4.0 (JAX on CPU) serving a tiny random Qwen3 built on disk, started from its
own venv (tests/integration/setup_skyrl04_env.sh, which run.sh builds and names in
``COOKBOOK_SKYRL_PYTHON``). CI's integration suite runs skyrl 0.3.0, which cannot parse what SDK
0.26 and later send; tinker-cookbook 0.6.1 needs SDK >= 0.26.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cookbook.test_cookbook_drop_in import arithmetic_cli, load_recipe, records
from tests.integration.skyrl_server import SkyRLServer, running_server
from trio_rl.cookbook import train as drop_in

SERVER_PYTHON_VARIABLE = "COOKBOOK_SKYRL_PYTHON"

RUN_TIMEOUT_S = 600.0
"""Wall-clock seconds for the whole recipe run; JAX compiles each new shape once (seconds each on 2 cores)."""


@pytest.fixture(scope="module")
def server() -> Iterator[SkyRLServer]:
    python = os.environ.get(SERVER_PYTHON_VARIABLE)
    if python is None:
        pytest.skip(f"{SERVER_PYTHON_VARIABLE} is not set: tests/cookbook/run.sh builds the skyrl 0.4.0 venv")
    if not Path(python).is_file():
        pytest.fail(f"{SERVER_PYTHON_VARIABLE}={python} does not exist", pytrace=False)
    # The engine loads the model in 15-25 s on an idle machine; a busy one takes minutes.
    with running_server(python=python, startup_timeout_s=300.0) as started:
        yield started


def posts(server: SkyRLServer) -> dict[str, int]:
    """How many times each API route was POSTed to, from the server's access log."""
    counts: dict[str, int] = {}
    for route in re.findall(r'"POST /api/v1/([a-z_/]+) HTTP', server.log_path.read_text(errors="replace")):
        counts[route] = counts.get(route, 0) + 1
    return counts


def test_math_rl_recipe_trains_through_the_drop_in_against_skyrl(
    tmp_path: Path, server: SkyRLServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in server.client_env().items():
        monkeypatch.setenv(name, value)
    recipe = load_recipe("recipes/math_rl/train.py", tmp_path)
    assert recipe.main is drop_in.main
    log_path = tmp_path / "run"
    cli = arithmetic_cli(recipe, log_path, model_name=server.base_model, base_url=server.base_url, lora_rank=8)
    before = posts(server)

    async def bounded() -> None:
        await asyncio.wait_for(recipe.cli_main(cli), RUN_TIMEOUT_S)

    asyncio.run(bounded())  # no use_backend: main's default, TinkerBackend(base_url=cli.base_url)

    steps = [r for r in records(log_path) if "progress/groups" in r]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(r["progress/groups"] == 2 and "env/all/reward/total" in r for r in steps)
    # The optimizer's metrics are the server's own (its names), so each step's optim_step reached it.
    assert all(r["optim/skyrl.ai/learning_rate"] == pytest.approx(1e-3) for r in steps)
    rows = [json.loads(line) for line in (log_path / "checkpoints.jsonl").read_text().splitlines()]
    assert [r["name"] for r in rows] == ["000001", "000002", "final"]
    assert all(r["state_path"].startswith("tinker://") and r["sampler_path"].startswith("tinker://") for r in rows)
    sent = {route: n - before.get(route, 0) for route, n in posts(server).items()}
    # Two steps of two groups of two: the Datums went to forward_backward once a step, and the
    # samples came from the server's sampler.
    assert sent.get("forward_backward", 0) >= 2 and sent.get("optim_step", 0) >= 2
    assert sent.get("asample", 0) >= 4
    assert sent.get("save_weights", 0) >= 2  # save_state for the two periodic checkpoints
