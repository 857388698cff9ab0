"""Checkpoint folders: weights (and optimizer state) in safetensors, metadata in JSON.

A checkpoint is a folder holding

* ``weights.safetensors``: the model's parameters;
* ``optimizer.safetensors``: Adam's moments (``exp_avg/<param>``, ``exp_avg_sq/<param>``),
  only for training state;
* ``meta.json``: format tag, kind (``"state"`` or ``"sampler"``), Adam step count;
* ``model_config.json`` and ``tokenizer.json``: enough to rebuild model and tokenizer.

Nothing is ever unpickled: tensors come back through safetensors and the rest is JSON.
Writes go to a temporary sibling folder renamed into place, so a crash never
leaves a half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from safetensors.torch import load_file, save_file
from torch import Tensor

from trio_rl.backends.local.model import ModelConfig
from trio_rl.backends.local.optimizer import AdamState
from trio_rl.backends.local.tokenizer import CharTokenizer

FORMAT = "trio_rl.local/1"
CheckpointKind = Literal["state", "sampler"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def check_name(name: str) -> None:
    """Accept only names that are one plain path component.

    Raises:
        ValueError: if ``name`` could escape the checkpoint folder or is empty.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"checkpoint name {name!r} must match {_NAME.pattern}")


@dataclass
class SavedState:
    """What :func:`load_checkpoint` reads back."""

    weights: dict[str, Tensor]
    adam: AdamState | None
    model_config: ModelConfig
    tokenizer: CharTokenizer
    kind: CheckpointKind


def save_checkpoint(
    path: Path,
    *,
    weights: dict[str, Tensor],
    adam: AdamState | None,
    model_config: ModelConfig,
    tokenizer: CharTokenizer,
    kind: CheckpointKind,
) -> None:
    """Write a checkpoint folder at ``path``, replacing one already there.

    Args:
        path: the folder to create.
        weights: parameter name to tensor.
        adam: optimizer state to save, or ``None`` for sampler weights.
        model_config: saved as ``model_config.json``.
        tokenizer: saved as ``tokenizer.json``.
        kind: ``"state"`` (resumable) or ``"sampler"`` (weights only).
    """

    def write(tmp: Path) -> None:
        save_file({k: v.detach().contiguous().clone() for k, v in weights.items()}, tmp / "weights.safetensors")
        meta: dict[str, Any] = {"format": FORMAT, "kind": kind}
        if adam is not None:
            save_file(adam_tensors(adam), tmp / "optimizer.safetensors")
            meta["step"] = adam.step
        (tmp / "meta.json").write_text(json.dumps(meta))
        (tmp / "model_config.json").write_text(model_config.to_json())
        (tmp / "tokenizer.json").write_text(tokenizer.to_json())

    write_folder_atomically(path, write)


def write_folder_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """Fill a temporary sibling folder with ``write(tmp)``, then rename it to ``path``.

    A crash never leaves a half-written folder under the final name; a folder
    already at ``path`` is replaced.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        write(tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def adam_tensors(adam: AdamState) -> dict[str, Tensor]:
    """Adam's moments as one flat dict: ``exp_avg/<param>`` and ``exp_avg_sq/<param>``."""
    moments = {f"exp_avg/{k}": v.contiguous().clone() for k, v in adam.exp_avg.items()}
    moments.update({f"exp_avg_sq/{k}": v.contiguous().clone() for k, v in adam.exp_avg_sq.items()})
    return moments


def load_adam(opt_file: Path, step: int) -> AdamState:
    """Read the moments :func:`adam_tensors` wrote to ``opt_file``, with the step count.

    Raises:
        ValueError: if the file holds a tensor of another kind.
    """
    adam = AdamState(step=step)
    for key, value in load_file(opt_file).items():
        group, _, name = key.partition("/")
        if group == "exp_avg":
            adam.exp_avg[name] = value
        elif group == "exp_avg_sq":
            adam.exp_avg_sq[name] = value
        else:
            raise ValueError(f"{opt_file} has an unexpected tensor {key!r}")
    return adam


def load_checkpoint(path: Path, *, with_optimizer: bool = True) -> SavedState:
    """Read a checkpoint folder written by :func:`save_checkpoint`.

    Args:
        path: the folder.
        with_optimizer: also read Adam's state (only ``"state"`` checkpoints have it).

    Returns:
        The weights, the optimizer state (``None`` if not asked for), config and tokenizer.

    Raises:
        FileNotFoundError: if ``path`` is not a checkpoint folder.
        ValueError: if the folder is of another format, or optimizer state was
            asked for and the checkpoint has none.
    """
    meta_file = path / "meta.json"
    if not meta_file.is_file():
        raise FileNotFoundError(f"{path} is not a LocalBackend checkpoint (no meta.json)")
    meta = json.loads(meta_file.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path} has checkpoint format {meta.get('format')!r}, expected {FORMAT!r}")
    kind: CheckpointKind = meta["kind"]
    adam: AdamState | None = None
    if with_optimizer:
        opt_file = path / "optimizer.safetensors"
        if kind != "state" or not opt_file.is_file():
            raise ValueError(f"{path} holds no optimizer state; load it with with_optimizer=False")
        adam = load_adam(opt_file, int(meta["step"]))
    return SavedState(
        weights=load_file(path / "weights.safetensors"),
        adam=adam,
        model_config=ModelConfig.from_json((path / "model_config.json").read_text()),
        tokenizer=CharTokenizer.from_json((path / "tokenizer.json").read_text()),
        kind=kind,
    )
