"""``HFBackend``: Hugging Face causal LMs (local folder or GGUF) with LoRA or full fine-tuning.

Needs the ``hf`` extra (``pip install 'trio_rl[hf]'``). This package imports
without it (transformers and peft are imported where they are used), and
constructing an :class:`HFBackend` without it raises :class:`MissingExtraError`
naming that command.
"""

from trio_rl.backends.hf._extra import MissingExtraError
from trio_rl.backends.hf.backend import HFBackend, HFModelSettings
from trio_rl.backends.hf.loading import SMOLLM2, load_tokenizer, resolve_source, smollm2_gguf_path
from trio_rl.backends.hf.sampler import HFSamplingClient
from trio_rl.backends.hf.training import HFTrainingClient

__all__ = [
    "SMOLLM2",
    "HFBackend",
    "HFModelSettings",
    "HFSamplingClient",
    "HFTrainingClient",
    "MissingExtraError",
    "load_tokenizer",
    "resolve_source",
    "smollm2_gguf_path",
]
