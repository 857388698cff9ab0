"""Shared pieces of the HFBackend tests: the tiny random Qwen3 (built once) and small helpers.

The model and its BPE tokenizer come from ``tests/integration/tiny_model.py``
(the SkyRL integration tests' builder), trained locally: nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tinker import types as tinker_types

pytest.importorskip("transformers")
pytest.importorskip("peft")

from tests.integration.tiny_model import TinyModel, build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A ~100k-parameter random ``Qwen3ForCausalLM`` with its tokenizer, in a temp folder."""
    root = tmp_path_factory.mktemp("hf") / "models" / "tiny-qwen3"
    return build_tiny_model(root, seed=0)


@pytest.fixture(scope="session")
def peaked_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """The tiny model with weights of std 0.5: its logits are far from uniform, so
    (unlike with the default 0.02, where the final norm and tied embeddings cap
    every logit near 0) a LoRA adapter on its linear layers can change what it samples."""
    root = tmp_path_factory.mktemp("hf") / "models" / "tiny-qwen3-peaked"
    return build_tiny_model(root, seed=0, initializer_range=0.5)


def backend(log_dir: Path, **kwargs: Any) -> Any:
    """An ``HFBackend`` on the CPU in float32, one torch thread (tests share the cores)."""
    from trio_rl.backends.hf import HFBackend

    kwargs.setdefault("device", "cpu")
    kwargs.setdefault("dtype", "float32")
    kwargs.setdefault("num_threads", 1)
    return HFBackend(log_dir=log_dir, **kwargs)


def datum(tokens: list[int], **inputs: list[float]) -> tinker_types.Datum:
    """A datum predicting ``tokens[1:]`` from ``tokens[:-1]``, with extra per-position inputs."""
    loss_fn_inputs: dict[str, Any] = {"target_tokens": tokens[1:], **inputs}
    return tinker_types.Datum(model_input=tinker_types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=loss_fn_inputs)
