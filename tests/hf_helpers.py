"""Shared pieces of the HFBackend tests; importing it skips a test module without the HF extra.

The tiny random Qwen3 itself is a fixture of ``tests/conftest.py`` (``tiny_model``, ``peaked_tiny_model``).

The model and its BPE tokenizer come from ``tests/integration/tiny_model.py``
(the SkyRL integration tests' builder), trained locally: nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import trio
from tinker import types as tinker_types

from tests.integration.tiny_model import TinyModel
from tests.pipeline_helpers import make_config
from trio_rl import Config
from trio_rl.backends.local.runtime import EngineSettings
from trio_rl.backends.protocol import TrainingClient

if TYPE_CHECKING:
    import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")


def backend(log_dir: Path, *, num_threads: int = 1, engine: EngineSettings | None = None, **model: Any) -> Any:
    """An ``HFBackend`` on the CPU in float32, one torch thread (tests share the cores).

    ``model`` holds :class:`~trio_rl.backends.HFModelSettings` fields other than those two.
    """
    from trio_rl.backends.hf import HFBackend, HFModelSettings

    settings = HFModelSettings(**{"device": "cpu", "dtype": "float32", **model})
    return HFBackend(log_dir=log_dir, num_threads=num_threads, model=settings, engine=engine)


@asynccontextmanager
async def training_client(
    log_dir: Path, base_model: str, *, lora_rank: int = 4, deadline_s: float = 60.0, **backend_options: Any
) -> AsyncIterator[tuple[Any, Any]]:
    """An entered :func:`backend` (``backend_options`` as there) and a training client of ``base_model``
    with seed 0 from it, the block failing once ``deadline_s`` seconds have passed since it opened."""
    with trio.fail_after(deadline_s):
        async with backend(log_dir, **backend_options) as be:
            yield be, await be.create_training_client(base_model=base_model, lora_rank=lora_rank, seed=0)


def run_config(log_path: Path, base_model: str, **fields: Any) -> Config:
    """A sync run of ``base_model`` (:func:`~tests.pipeline_helpers.make_config`'s) on a rank-8 LoRA
    at learning rate 2e-2, seed 0, but for what ``fields`` set."""
    defaults = {"base_model": base_model, "lora_rank": 8, "learning_rate": 2e-2, "seed": 0}
    return make_config(log_path, "sync", **{**defaults, **fields})


def datum(tokens: list[int], **inputs: list[float]) -> tinker_types.Datum:
    """A datum predicting ``tokens[1:]`` from ``tokens[:-1]``, with extra per-position inputs."""
    loss_fn_inputs: dict[str, Any] = {"target_tokens": tokens[1:], **inputs}
    return tinker_types.Datum(model_input=tinker_types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=loss_fn_inputs)


TRAIN_DATA = [datum([5, 17, 42, 99, 7, 3], weights=[1.0] * 5), datum([8, 8, 100, 250, 1], weights=[1.0] * 4)]
"""Two small cross-entropy Datums that tests train a tiny model on for a few steps."""

TRAIN_ADAM = tinker_types.AdamParams(learning_rate=5e-2)


async def forward_backward_once(
    log_dir: Path, model: TinyModel, data: list[tinker_types.Datum], loss_fn: str, token_budget: int
) -> tuple[tinker_types.ForwardBackwardOutput, dict[str, torch.Tensor]]:
    """One forward_backward of ``data`` on a fresh LoRA of ``model`` whose B matrices are nonzero (so the
    A matrices get gradients too), micro-batched by ``token_budget``: its output and each trained
    parameter's gradient."""
    import torch

    async with backend(log_dir, token_budget=token_budget) as be:
        trainer = await be.create_training_client(base_model=model.path, lora_rank=4, seed=0)
        with torch.no_grad():
            for name, p in trainer.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
        out = await (await trainer.forward_backward(data, loss_fn)).result()
        return out, {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


async def train_steps(trainer: TrainingClient, steps: int) -> None:
    """``steps`` steps of cross entropy on :data:`TRAIN_DATA`, each waited for."""
    for _ in range(steps):
        fb = await trainer.forward_backward(TRAIN_DATA, "cross_entropy")
        opt = await trainer.optim_step(TRAIN_ADAM)
        await fb.result()
        await opt.result()
