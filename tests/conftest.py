"""Shared fixtures: a run folder, readers of the JSONL files a run writes, Trio's task order by seed, the
SDK stand-in and the tiny HF models; and the importer of the examples."""

from __future__ import annotations

import contextlib
import importlib
import json
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.integration.tiny_model import TinyModel
    from tests.tinker_sdk_standin import StandinServiceClient

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

TaskOrder = Callable[[int], contextlib.AbstractContextManager[None]]
"""``with task_order(seed):``: Trio runs ready tasks in the order ``random.Random(seed)`` draws."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a ``.jsonl`` file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_metrics_by_step(path: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` merged per step (training, evaluation and final records)."""
    merged: dict[int, dict[str, Any]] = {}
    for record in read_jsonl(path):
        merged.setdefault(record["step"], {}).update(record)
    return [merged[step] for step in sorted(merged)]


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py``, imported as the module ``name`` (as the examples import each other)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "run"


@pytest.fixture
def trio_task_order_from_seed(monkeypatch: pytest.MonkeyPatch) -> TaskOrder:
    """Make the order in which Trio runs each batch of ready tasks follow a seed, to vary it on purpose.

    Trio shuffles every batch with one module-level generator and has no public
    way to seed it (its own Hypothesis plugin registers that same generator with
    ``hypothesis.register_random``). Inside ``with task_order(seed):`` the
    generator is ``random.Random(seed)``; pytest's ``monkeypatch`` puts Trio's
    own back when the block ends, whatever happens in it.

    Raises:
        RuntimeError: if Trio no longer keeps the generator where this expects it,
            rather than letting a test pass without varying the order.
    """
    scheduler = importlib.import_module("trio._core._run")
    if not isinstance(getattr(scheduler, "_r", None), random.Random):
        raise RuntimeError("trio._core._run._r is not a random.Random: Trio's scheduler moved its generator")

    @contextlib.contextmanager
    def task_order(seed: int) -> Iterator[None]:
        with monkeypatch.context() as patch:
            patch.setattr(scheduler, "_r", random.Random(seed))
            yield

    return task_order


@pytest.fixture
def service() -> Iterator[StandinServiceClient]:
    """A running SDK stand-in (tests/tinker_sdk_standin.py) with its default settings, for TinkerBackend."""
    from tests.tinker_sdk_standin import open_standin_service

    with open_standin_service() as service:
        yield service


def _tiny_model_builder() -> Callable[..., TinyModel]:
    """``build_tiny_model``, or a skip of the asking test without the HF extra."""
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from tests.integration.tiny_model import build_tiny_model

    return build_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A ~100k-parameter random ``Qwen3ForCausalLM`` with its tokenizer, in a temp folder.

    A test that asks for it skips without the HF extra (transformers and peft).
    """
    build_tiny_model = _tiny_model_builder()
    root = tmp_path_factory.mktemp("hf") / "models" / "tiny-qwen3"
    return build_tiny_model(root, seed=0)


@pytest.fixture(scope="session")
def peaked_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """The tiny model with weights of std 0.5: its logits are far from uniform, so
    (unlike with the default 0.02, where the final norm and tied embeddings cap
    every logit near 0) a LoRA adapter on its linear layers can change what it samples."""
    build_tiny_model = _tiny_model_builder()
    root = tmp_path_factory.mktemp("hf") / "models" / "tiny-qwen3-peaked"
    return build_tiny_model(root, seed=0, initializer_range=0.5)
