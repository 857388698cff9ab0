"""HF checkpoint folders: peft's adapter layout (or full weights), optimizer, JSON metadata.

A folder written by ``save_state`` or ``save_weights_for_sampler`` holds

* LoRA: ``adapter_model.safetensors`` and ``adapter_config.json``, exactly as
  peft writes them, so ``PeftModel.from_pretrained(base, folder)`` loads it;
* full fine-tuning: ``model.safetensors`` (the ``state_dict``);
* ``optimizer.safetensors``: Adam's moments, for training state only;
* ``trio_rl.json``: format tag, kind, Adam step, base model source, LoRA rank/alpha.

Nothing is pickled or unpickled. Writes are atomic (temporary folder renamed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from safetensors.torch import load_file, save_file
from torch import Tensor

from trio_rl.backends.hf.loading import ModelSource
from trio_rl.backends.hf.policy import Policy
from trio_rl.backends.local.checkpoint import adam_tensors, load_adam, write_folder_atomically
from trio_rl.backends.local.optimizer import AdamState

FORMAT = "trio_rl.hf/1"
META_FILE = "trio_rl.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
FULL_WEIGHTS = "model.safetensors"
CheckpointKind = Literal["state", "sampler"]


@dataclass
class HFCheckpoint:
    """What :func:`load_hf_checkpoint` reads back."""

    source: ModelSource
    lora_rank: int
    lora_alpha: float
    weights: dict[str, Tensor]
    adam: AdamState | None
    kind: CheckpointKind


def save_hf_checkpoint(
    path: Path, policy: Policy, source: ModelSource, adam: AdamState | None, kind: CheckpointKind
) -> None:
    """Write the trained weights (and Adam's state, if given) to the folder ``path``."""
    weights = {k: v.detach().to("cpu").contiguous().clone() for k, v in policy.trained_state().items()}

    def write(tmp: Path) -> None:
        if policy.is_lora:
            save_file(weights, tmp / ADAPTER_WEIGHTS, metadata={"format": "pt"})
            config = policy.lora_config
            config.base_model_name_or_path = source.label
            config.save_pretrained(str(tmp))
        else:
            save_file(weights, tmp / FULL_WEIGHTS, metadata={"format": "pt"})
        meta: dict[str, Any] = {
            "format": FORMAT,
            "kind": kind,
            "source": source.to_json(),
            "lora_rank": policy.lora_rank,
            "lora_alpha": policy.lora_alpha,
        }
        if adam is not None:
            save_file({k: v.to("cpu") for k, v in adam_tensors(adam).items()}, tmp / "optimizer.safetensors")
            meta["step"] = adam.step
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))

    write_folder_atomically(path, write)


def load_hf_checkpoint(path: Path, *, with_optimizer: bool = True) -> HFCheckpoint:
    """Read a folder written by :func:`save_hf_checkpoint`.

    Raises:
        FileNotFoundError: if ``path`` is not such a folder.
        ValueError: for another format, or no optimizer state when one is asked for.
    """
    if not path.is_dir():
        raise FileNotFoundError(f"no checkpoint folder at {path}")
    meta_file = path / META_FILE
    if not meta_file.is_file():
        raise FileNotFoundError(f"{path} is not an HF backend checkpoint (no {META_FILE})")
    meta = json.loads(meta_file.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} has checkpoint format {meta.get('format')!r}, expected {FORMAT!r}")
    adam: AdamState | None = None
    if with_optimizer:
        opt_file = path / "optimizer.safetensors"
        if meta["kind"] != "state" or not opt_file.is_file():
            raise ValueError(f"{path} holds no optimizer state; load it with with_optimizer=False")
        adam = load_adam(opt_file, int(meta["step"]))
    lora_rank = int(meta["lora_rank"])
    return HFCheckpoint(
        source=ModelSource.from_json(meta["source"]),
        lora_rank=lora_rank,
        lora_alpha=float(meta["lora_alpha"]),
        weights=load_file(path / (ADAPTER_WEIGHTS if lora_rank else FULL_WEIGHTS)),
        adam=adam,
        kind=meta["kind"],
    )
