"""``LocalBackend``: train and sample a small transformer in-process with torch.

No key, no GPU, no downloads: the model is a tiny decoder-only transformer
defined here (:class:`ModelConfig`) over a character tokenizer
(:class:`CharTokenizer`), trained with full-parameter Adam.
"""

import importlib

try:
    # Imported here only to fail early and clearly.
    importlib.import_module("safetensors")
    importlib.import_module("torch")
except ImportError as _error:
    # torch is an extra: say which one, rather than fail deep inside the backend's imports.
    raise ImportError(
        f"LocalBackend needs torch and safetensors, which trio_rl installs only with its 'local' extra: "
        f"pip install 'trio_rl[local]' ({_error})",
        name=_error.name,
    ) from _error

from trio_rl.backends.local.backend import LocalBackend
from trio_rl.backends.local.model import ModelConfig
from trio_rl.backends.local.runtime import EngineSettings
from trio_rl.backends.local.tokenizer import CharTokenizer

__all__ = ["CharTokenizer", "EngineSettings", "LocalBackend", "ModelConfig"]
