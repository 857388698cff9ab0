"""``HFBackend``: Hugging Face causal LMs (local folder or GGUF) with LoRA or full fine-tuning.

Needs the ``hf`` extra (``pip install 'trio_rl[hf]'``); importing this package
without it raises :class:`MissingExtraError` with that command.
"""

from trio_rl.backends.hf._extra import MissingExtraError, require_hf_extra

require_hf_extra()

from trio_rl.backends.hf.backend import HFBackend  # noqa: E402
from trio_rl.backends.hf.loading import SMOLLM2, resolve_source, smollm2_gguf_path  # noqa: E402
from trio_rl.backends.hf.sampler import HFSamplingClient  # noqa: E402
from trio_rl.backends.hf.training import HFTrainingClient  # noqa: E402

__all__ = [
    "SMOLLM2",
    "HFBackend",
    "HFSamplingClient",
    "HFTrainingClient",
    "MissingExtraError",
    "resolve_source",
    "smollm2_gguf_path",
]
