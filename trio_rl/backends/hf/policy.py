"""The weights being trained, and cheap frozen snapshots of them for sampling.

With LoRA (``lora_rank > 0``) the base model is frozen and shared: the trained
adapter is peft's ``"default"`` adapter, and each snapshot is another adapter
on the same model holding a copy of the trained adapter's weights, so a
snapshot costs the adapter's size, not the model's. A snapshot's adapter is
reused by a later snapshot once no engine holds the first (peft's
``add_adapter`` costs far more than copying the weights). Which adapter a forward
pass uses is chosen by :meth:`Policy.activate` right before it; every torch
job of a backend runs under one thread limiter, so switching cannot race.

With full fine-tuning (``lora_rank == 0``) a snapshot is a frozen deep copy of
the model.
"""

from __future__ import annotations

import copy
import itertools
import threading
import weakref
from typing import Any

import torch
from torch import nn

TRAIN_ADAPTER = "default"
"""peft's name of the adapter that is trained (and saved, in peft's layout)."""


class Policy:
    """The live model (a peft model under LoRA) and its snapshot adapters.

    Args:
        base: the loaded causal LM.
        lora_rank: LoRA rank on every linear layer but the output head; ``0``
            fine-tunes every parameter.
        lora_alpha: LoRA's scaling numerator (``alpha / rank`` scales the update).
        seed: seeds the LoRA initialisation (``A`` random, ``B`` zero).
    """

    def __init__(self, base: nn.Module, *, lora_rank: int, lora_alpha: float, seed: int) -> None:
        if lora_rank < 0:
            raise ValueError("lora_rank must be 0 (full fine-tuning) or positive")
        self.lora_rank = lora_rank
        self.lora_alpha = lora_alpha
        self.lora_config: Any = None
        self._names = itertools.count()
        self._lock = threading.Lock()
        self._retired: list[str] = []
        self._free: list[str] = []  # snapshot adapters no engine uses: reused before a new one is added
        self._pairs: dict[str, list[tuple[nn.Parameter, nn.Parameter]]] = {}
        if lora_rank:
            from peft import LoraConfig, get_peft_model

            self.lora_config = LoraConfig(
                r=lora_rank,
                lora_alpha=lora_alpha,  # type: ignore[arg-type]  # peft accepts a float
                lora_dropout=0.0,
                target_modules="all-linear",
                bias="none",
                task_type="CAUSAL_LM",
            )
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.model: nn.Module = get_peft_model(base, self.lora_config)
        else:
            self.model = base
            self.model.requires_grad_(True)
        self.model.eval()
        self._fix_trainable()

    @property
    def is_lora(self) -> bool:
        """Whether only a LoRA adapter is trained."""
        return self.lora_rank > 0

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: token ids must be below this."""
        return int(self.model.get_input_embeddings().num_embeddings)  # type: ignore[operator]

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return next(self.model.parameters()).device

    def _fix_trainable(self) -> None:
        # peft marks a newly added adapter trainable; only the trained adapter may be,
        # or Adam would keep moments for snapshots.
        if not self.is_lora:
            return
        marker = f".{TRAIN_ADAPTER}."
        for name, param in self.model.named_parameters():
            param.requires_grad_(".lora_" in name and marker in name)

    def activate(self, adapter: str = TRAIN_ADAPTER) -> None:
        """Make ``adapter`` the one forward passes use (worker thread, under the limiter)."""
        self._collect()
        if self.is_lora and self.model.active_adapter != adapter:
            self.model.set_adapter(adapter)  # type: ignore[operator]
            self._fix_trainable()

    def trained_state(self) -> dict[str, torch.Tensor]:
        """The trained weights in the layout ``save_state`` writes.

        LoRA: the adapter as peft saves it (``...lora_A.weight``, adapter name
        removed); full fine-tuning: the model's ``state_dict``.
        """
        if self.is_lora:
            from peft import get_peft_model_state_dict

            # Embeddings are never adapted here; "auto" would probe the hub for a config.
            return dict(get_peft_model_state_dict(self.model, adapter_name=TRAIN_ADAPTER, save_embedding_layers=False))
        return dict(self.model.state_dict())

    def load_trained_state(self, state: dict[str, torch.Tensor]) -> None:
        """Replace the trained weights with ``state`` (as from :meth:`trained_state`).

        Raises:
            ValueError: if ``state`` misses weights or has unknown ones.
        """
        device = self.device
        state = {k: v.to(device) for k, v in state.items()}
        if self.is_lora:
            from peft import set_peft_model_state_dict

            result = set_peft_model_state_dict(self.model, state, adapter_name=TRAIN_ADAPTER)
            unexpected = list(getattr(result, "unexpected_keys", []))
            missing = [k for k in getattr(result, "missing_keys", []) if ".lora_" in k and f".{TRAIN_ADAPTER}." in k]
            if unexpected or missing:
                raise ValueError(
                    f"adapter weights do not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}"
                )
        else:
            self.model.load_state_dict(state)
        self.model.zero_grad(set_to_none=True)

    def snapshot(self) -> Snapshot:
        """Freeze a copy of the trained weights (worker thread, under the limiter)."""
        self._collect()
        if not self.is_lora:
            frozen = copy.deepcopy(self.model).requires_grad_(False).eval()
            return Snapshot(self, frozen, None)
        name = self._free.pop() if self._free else self._new_adapter()
        with torch.no_grad():
            for copy_to, trained in self._pairs[name]:
                copy_to.copy_(trained)
        return Snapshot(self, self.model, name)

    def _new_adapter(self) -> str:
        name = f"snapshot-{next(self._names)}"
        with torch.random.fork_rng(devices=[]):  # its random init is overwritten by the copy
            self.model.add_adapter(name, self.lora_config)  # type: ignore[operator]
        params = dict(self.model.named_parameters())
        self._pairs[name] = [
            (p, params[n.replace(f".{name}.", f".{TRAIN_ADAPTER}.")]) for n, p in params.items() if f".{name}." in n
        ]
        self._fix_trainable()
        return name

    def retire(self, adapter: str) -> None:
        """Hand a snapshot's adapter back for reuse from the next job on (any thread, never blocks)."""
        with self._lock:
            self._retired.append(adapter)

    def _collect(self) -> None:
        with self._lock:
            retired, self._retired = self._retired, []
        self._free.extend(retired)


class Snapshot:
    """Frozen weights a sampling engine reads: an adapter of the policy, or a model of its own.

    When the snapshot is garbage-collected its adapter is deleted at the
    policy's next job. A model no training client changes (a base model, or
    weights loaded from a folder) is a snapshot with no policy: it is never switched.
    """

    def __init__(self, policy: Policy | None, model: nn.Module, adapter: str | None) -> None:
        if adapter is not None and policy is None:
            raise ValueError("a snapshot adapter belongs to a policy")
        self.model = model
        self._policy = policy
        self._adapter = adapter
        if policy is not None and adapter is not None:
            weakref.finalize(self, policy.retire, adapter)

    def activate(self) -> None:
        """Select these weights for the next forward pass (worker thread, under the limiter)."""
        if self._policy is not None and self._adapter is not None:
            self._policy.activate(self._adapter)
