"""``LocalBackend``: train and sample a small transformer in-process with torch.

No key, no GPU, no downloads: the model is a tiny decoder-only transformer
defined here (:class:`ModelConfig`) over a character tokenizer
(:class:`CharTokenizer`), trained with full-parameter Adam.
"""

try:
    import safetensors  # noqa: F401  (imported here only to fail early and clearly)
    import torch  # noqa: F401
except ImportError as _error:
    # torch is an extra: say which one, rather than fail deep inside the backend's imports.
    raise ImportError(
        f"LocalBackend needs torch and safetensors, which trio_rl installs only with its 'local' extra: "
        f"pip install 'trio_rl[local]' ({_error})",
        name=_error.name,
    ) from _error

from trio_rl.backends.local.backend import LocalBackend  # noqa: E402
from trio_rl.backends.local.model import ModelConfig  # noqa: E402
from trio_rl.backends.local.tokenizer import CharTokenizer  # noqa: E402

__all__ = ["CharTokenizer", "LocalBackend", "ModelConfig"]
