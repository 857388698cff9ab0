"""Shared pieces of the LocalBackend tests: a small model on a character tokenizer, and its inputs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from tinker import types as tinker_types

from trio_rl import _tinker_compat as compat
from trio_rl.backends.local import CharTokenizer, EngineSettings, LocalBackend, ModelConfig
from trio_rl.backends.local.training import LocalTrainingClient

TOK = CharTokenizer("abcdefgh ")
CONFIG = ModelConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=64)
SMALL_CONFIG = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=32)
"""Smaller still, for the tests that only need a forward and backward pass to run."""


def local_backend(
    log_dir: Path,
    engine: EngineSettings | None = None,
    *,
    model_config: ModelConfig = CONFIG,
    tokenizer: CharTokenizer = TOK,
) -> LocalBackend:
    """A LocalBackend of ``model_config`` (:data:`CONFIG`) on ``tokenizer`` (:data:`TOK`), not yet entered."""
    return LocalBackend(log_dir=log_dir, model_config=model_config, tokenizer=tokenizer, engine=engine)


@asynccontextmanager
async def local_training_client(
    log_dir: Path, *, seed: int = 0, deadline_s: float = 60.0, **backend_options: Any
) -> AsyncIterator[tuple[LocalBackend, LocalTrainingClient]]:
    """An entered :func:`local_backend` (``backend_options`` as there) and a training client of it
    with ``seed``, the block failing once ``deadline_s`` seconds have passed since it opened."""
    with trio.fail_after(deadline_s):
        async with local_backend(log_dir, **backend_options) as backend:
            yield backend, await backend.create_training_client(base_model="tiny", seed=seed)


def bos_prompt(text: str) -> list[int]:
    """``text``'s tokens after the BOS token."""
    return [TOK.bos_token_id, *TOK.encode(text)]


def text_datum(text: str) -> tinker_types.Datum:
    """A cross-entropy Datum of BOS, ``text`` and EOS, every target weighted 1."""
    seq = [*bos_prompt(text), TOK.eos_token_id]
    return tinker_types.Datum(
        model_input=tinker_types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={
            "target_tokens": compat.tensor(seq[1:], "int64"),
            "weights": compat.tensor([1.0] * (len(seq) - 1), "float32"),
        },
    )
