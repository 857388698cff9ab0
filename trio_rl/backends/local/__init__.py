"""``LocalBackend``: train and sample a small transformer in-process with torch.

No key, no GPU, no downloads: the model is a tiny decoder-only transformer
defined here (:class:`ModelConfig`) over a character tokenizer
(:class:`CharTokenizer`), trained with full-parameter Adam.
"""

from trio_rl.backends.local.backend import LocalBackend
from trio_rl.backends.local.model import ModelConfig
from trio_rl.backends.local.tokenizer import CharTokenizer

__all__ = ["CharTokenizer", "LocalBackend", "ModelConfig"]
