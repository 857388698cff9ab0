"""Backends: the client protocol and its implementations.

- :class:`~trio_rl.testing.FakeBackend` (in :mod:`trio_rl.testing`): virtual time, for tests.
- :class:`LocalBackend`: torch in-process; no key, no GPU, no downloads.
- :class:`HFBackend`: a Hugging Face causal LM in-process, LoRA or full
  fine-tuning (the ``hf`` extra: ``pip install 'trio_rl[hf]'``).
- :class:`TinkerBackend`: the Tinker service (or a Tinker-compatible server).

The real backends are imported lazily, so ``import trio_rl`` pulls in
neither torch's start-up cost, transformers, nor the tinker SDK's client machinery.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .protocol import Backend, PendingResult, SamplingClient, Tokenizer, TrainingClient

if TYPE_CHECKING:
    from ._future_bridge import RemoteTimeoutError
    from .hf import HFBackend, HFModelSettings
    from .local import CharTokenizer, EngineSettings, LocalBackend, ModelConfig
    from .tinker import InflightWeightsRefusedError, MissingApiKeyError, TinkerBackend, TinkerTimeouts

_LAZY = {
    "LocalBackend": ".local",
    "ModelConfig": ".local",
    "CharTokenizer": ".local",
    "EngineSettings": ".local",
    "HFBackend": ".hf",
    "HFModelSettings": ".hf",
    "TinkerBackend": ".tinker",
    "TinkerTimeouts": ".tinker",
    "MissingApiKeyError": ".tinker",
    "InflightWeightsRefusedError": ".tinker",
    "RemoteTimeoutError": "._future_bridge",
}

__all__ = [
    "Backend",
    "CharTokenizer",
    "EngineSettings",
    "HFBackend",
    "HFModelSettings",
    "InflightWeightsRefusedError",
    "LocalBackend",
    "MissingApiKeyError",
    "ModelConfig",
    "PendingResult",
    "RemoteTimeoutError",
    "SamplingClient",
    "TinkerBackend",
    "TinkerTimeouts",
    "Tokenizer",
    "TrainingClient",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
