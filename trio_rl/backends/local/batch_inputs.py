"""From ``tinker.types.Datum`` batches to loss tensors and back, for any in-process model.

The model-independent half of ``forward_backward``: validate each datum's
``model_input`` and ``loss_fn_inputs``, turn them into tensors, apply a loss of
:mod:`.losses` to the learner's logprobs of the target tokens, and pack the
per-datum outputs. The toy model and the Hugging Face backend differ only in
how they compute those logprobs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tinker import types as tinker_types
from torch import Tensor

from trio_rl import _tinker_compat
from trio_rl.backends.local.losses import LOSS_FUNCTIONS, REQUIRED_INPUTS
from trio_rl.backends.local.offpolicy import Correction, parse_correction, weight_statistics
from trio_rl.backends.local.prefix_cache import common_prefix_length
from trio_rl.base.reduced_metrics import add_reduced


def as_array(value: object) -> np.ndarray:
    """A ``loss_fn_inputs`` value (TensorData on any SDK version, numpy, torch, list) as numpy."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    to_numpy = getattr(value, "to_numpy", None)
    if callable(to_numpy):
        return np.asarray(to_numpy())
    data = getattr(value, "data", value)
    return np.asarray(data)


@dataclass
class DatumInputs:
    """One datum, checked: its input tokens and its ``loss_fn_inputs`` as CPU tensors."""

    tokens: list[int]
    tensors: dict[str, Tensor]

    @property
    def targets(self) -> Tensor:
        """The ``target_tokens`` (long)."""
        return self.tensors["target_tokens"]


def parse_batch(
    data: Sequence[tinker_types.Datum], loss_fn: str, *, vocab_size: int, max_seq_len: int
) -> list[DatumInputs]:
    """Check every datum of a batch and turn it into tensors.

    Raises:
        ValueError: for an empty or too long input, missing inputs, mismatched
            lengths or out-of-range tokens, naming the datum.
    """
    parsed: list[DatumInputs] = []
    for i, datum in enumerate(data):
        seq = _tinker_compat.token_ids(datum.model_input, f"datum {i}'s model_input")
        if not seq:
            raise ValueError(f"datum {i} has an empty model_input")
        if len(seq) > max_seq_len:
            raise ValueError(f"datum {i} has {len(seq)} tokens, more than max_seq_len {max_seq_len}")
        missing = [k for k in REQUIRED_INPUTS[loss_fn] if k not in datum.loss_fn_inputs]
        if missing:
            raise ValueError(f"datum {i} lacks loss_fn_inputs {missing} needed by {loss_fn!r}")
        tensors: dict[str, Tensor] = {}
        for key, value in datum.loss_fn_inputs.items():
            array = as_array(value).reshape(-1)
            if array.shape[0] != len(seq):
                raise ValueError(
                    f"datum {i}: loss_fn_inputs[{key!r}] has {array.shape[0]} values for {len(seq)} tokens"
                )
            dtype = torch.long if key == "target_tokens" else torch.float32
            tensors[key] = torch.as_tensor(array.copy()).to(dtype)
        targets = tensors["target_tokens"]
        if int(targets.min()) < 0 or int(targets.max()) >= vocab_size:
            raise ValueError(f"datum {i} has target tokens outside [0, {vocab_size})")
        if any(not 0 <= t < vocab_size for t in seq):
            raise ValueError(f"datum {i} has input tokens outside [0, {vocab_size})")
        parsed.append(DatumInputs(seq, tensors))
    return parsed


def datum_losses(
    logprobs: Sequence[Tensor], inputs: Sequence[DatumInputs], loss_fn: str, config: Mapping[str, float]
) -> list[Tensor]:
    """Per-token losses of each datum, from the learner's target logprobs (``[len]`` each)."""
    fn = LOSS_FUNCTIONS[loss_fn]
    return [
        fn(lp, {k: v.to(lp.device) for k, v in datum.tensors.items()}, config)
        for lp, datum in zip(logprobs, inputs, strict=True)
    ]


def datum_outputs(logprobs: Sequence[Tensor], losses: Sequence[Tensor]) -> list[dict[str, tinker_types.TensorData]]:
    """The ``loss_fn_outputs`` of each datum: ``logprobs`` and ``elementwise_loss`` as float32."""
    return [
        {
            "logprobs": _tinker_compat.tensor(lp.detach().float().cpu().numpy(), "float32"),
            "elementwise_loss": _tinker_compat.tensor(loss.detach().float().cpu().numpy(), "float32"),
        }
        for lp, loss in zip(logprobs, losses, strict=True)
    ]


ADVANTAGE_WEIGHTED = frozenset({"importance_sampling", "ppo", "cispo"})
"""Losses whose per-token value is zero where the advantage is zero."""


def scored_positions(datum: DatumInputs, loss_fn: str) -> Tensor:
    """Where the learner's logprob is needed: positions whose loss can be nonzero, and ``mask`` positions.

    The others (prompt tokens, zero advantages, zero weights) add nothing to
    the loss or its gradient, so their logits are never computed; ``mask``
    positions are kept so that the returned logprobs of every sampled token
    can be compared with the sampler's.
    """
    tensors = datum.tensors
    keep = torch.ones(len(datum.tokens), dtype=torch.bool)
    if "weights" in tensors:
        keep &= tensors["weights"] != 0
    if loss_fn in ADVANTAGE_WEIGHTED:
        keep &= tensors["advantages"] != 0
    if "mask" in tensors:
        keep |= tensors["mask"] > 0
    return keep


def logprobs_at(
    hidden: Tensor, head: Callable[[Tensor], Tensor], inputs: Sequence[DatumInputs], keep: Sequence[Tensor]
) -> list[Tensor]:
    """Each datum's ``[len]`` target logprobs, the output head applied only where ``keep`` says.

    Args:
        hidden: ``[rows, width, d]`` final hidden states of the right-padded batch.
        head: hidden states to logits.
        inputs: the batch's data.
        keep: per datum, a ``[len]`` bool of the positions to score (:func:`scored_positions`).

    Returns:
        Logprobs with grad at the kept positions; elsewhere the datum's own
        sampling ``logprobs`` (0 where it has none), which make the loss there
        exactly zero whatever the loss function.
    """
    device = hidden.device
    rows = torch.cat([torch.full((int(k.sum()),), i) for i, k in enumerate(keep)]).to(device)
    cols = torch.cat([k.nonzero()[:, 0] for k in keep]).to(device)
    return logprobs_of(hidden[rows, cols], head, inputs, keep)


def logprobs_of(
    scored: Tensor, head: Callable[[Tensor], Tensor], inputs: Sequence[DatumInputs], keep: Sequence[Tensor]
) -> list[Tensor]:
    """:func:`logprobs_at` from the hidden states of the kept positions alone.

    Args:
        scored: ``[kept, d]``: the hidden state at each kept position, datum by
            datum, positions in order.
        head: hidden states to logits.
        inputs: the data.
        keep: per datum, a ``[len]`` bool of the positions to score.

    Returns:
        As :func:`logprobs_at`.
    """
    device = scored.device
    targets = torch.cat([d.targets[k] for d, k in zip(inputs, keep, strict=True)]).to(device)
    logits = head(scored).float()
    # logsumexp then gather: no [tokens, vocab] log_softmax tensor kept for backward.
    picked = logits.gather(1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)
    out: list[Tensor] = []
    for datum, k, part in zip(inputs, keep, torch.split(picked, [int(k.sum()) for k in keep]), strict=True):
        base = datum.tensors.get("logprobs", torch.zeros(len(datum.tokens)))
        out.append(base.to(device=device, dtype=part.dtype).masked_scatter(k.to(device), part))
    return out


@dataclass(frozen=True)
class PrefixGroup:
    """Data of a batch whose inputs all start with the same ``length`` tokens.

    Attributes:
        rows: indices into the batch, at least two, ascending.
        length: tokens shared; every datum has at least one token after them.
    """

    rows: tuple[int, ...]
    length: int


@dataclass(frozen=True)
class MicroBatch:
    """Data run as one forward/backward pass: some in full, some as groups that share a prefix.

    Attributes:
        full: indices into the batch of the data run whole.
        shared: groups whose prefix runs once for all of its rows.
    """

    full: tuple[int, ...] = ()
    shared: tuple[PrefixGroup, ...] = ()

    @property
    def rows(self) -> list[int]:
        """Every index of the micro-batch: ``full`` then each group's rows (the order its logprobs come in)."""
        return [*self.full, *(i for g in self.shared for i in g.rows)]

    def tokens(self, inputs: Sequence[DatumInputs]) -> int:
        """Positions its forward passes run, padding included, each shared prefix once.

        The full rows run as one right-padded batch; the groups' prefixes as
        another, then their rows' suffixes as a third.
        """
        total = len(self.full) * max((len(inputs[i].tokens) for i in self.full), default=0)
        if self.shared:
            longest = max(g.length for g in self.shared)
            suffix = max(len(inputs[i].tokens) - g.length for g in self.shared for i in g.rows)
            total += len(self.shared) * longest + sum(len(g.rows) for g in self.shared) * suffix
        return total


def _shareable_length(a: list[int], b: list[int]) -> int:
    """Tokens ``a`` and ``b`` start with alike, leaving each at least one of its own."""
    return max(0, min(common_prefix_length(a, b), len(a) - 1, len(b) - 1))


def prefix_groups(inputs: Sequence[DatumInputs], min_length: int) -> list[PrefixGroup]:
    """Group the data that share a prefix of at least ``min_length`` tokens, saving the most tokens.

    A group of ``n`` data sharing ``p`` tokens runs ``(n - 1) * p`` fewer
    positions than its data run whole. Sorted, data sharing a prefix are
    neighbours, and a run of neighbours shares the shortest of its neighbours'
    common prefixes; the split of the sorted data into runs that saves the most
    is found exactly (dynamic programming, quadratic only over runs sharing at
    least ``min_length`` tokens). A GRPO group (one prompt, several samples)
    shares at least its prompt; the turns of a multi-turn episode share the
    conversation so far.

    Returns:
        The groups of two or more data, ordered by their first index; a datum
        in none runs whole.
    """
    order = sorted(range(len(inputs)), key=lambda i: inputs[i].tokens)
    common = [_shareable_length(inputs[a].tokens, inputs[b].tokens) for a, b in itertools.pairwise(order)]
    # best[j]: most tokens saved over order[:j]; start[j]: where its last run starts (j - 1: a datum alone).
    best = [0] * (len(order) + 1)
    start = list(range(-1, len(order)))
    length = [0] * (len(order) + 1)
    for j in range(2, len(order) + 1):
        best[j], start[j] = best[j - 1], j - 1
        shared = common[j - 2]
        for i in range(j - 2, -1, -1):
            shared = min(shared, common[i])
            if shared < min_length:
                break
            if best[i] + (j - i - 1) * shared > best[j]:
                best[j], start[j], length[j] = best[i] + (j - i - 1) * shared, i, shared
    groups: list[PrefixGroup] = []
    j = len(order)
    while j > 0:
        i = start[j]
        if j - i >= 2:
            groups.append(PrefixGroup(tuple(sorted(order[i:j])), length[j]))
        j = i
    return sorted(groups, key=lambda g: g.rows[0])


def micro_batches(inputs: Sequence[DatumInputs], token_budget: int, *, min_prefix: int = 0) -> list[MicroBatch]:
    """Split data into micro-batches whose :meth:`MicroBatch.tokens` fit ``token_budget``.

    Args:
        inputs: the checked batch.
        token_budget: most positions per micro-batch; a datum longer than it
            gets a micro-batch of its own.
        min_prefix: with a positive value, data sharing at least this many
            leading tokens (:func:`prefix_groups`) run their prefix once, a
            group split across micro-batches where it does not fit in one;
            ``0`` runs every datum whole.

    Returns:
        Micro-batches covering every datum once, in the batch's order of their
        first datum.
    """
    groups = prefix_groups(inputs, min_prefix) if min_prefix > 0 else []
    grouped = {i for g in groups for i in g.rows}
    units: list[tuple[int, PrefixGroup | None]] = [(g.rows[0], g) for g in groups]
    units += [(i, None) for i in range(len(inputs)) if i not in grouped]
    batches: list[MicroBatch] = []
    current = MicroBatch()
    for first, group in sorted(units, key=lambda u: u[0]):
        pieces = [MicroBatch(full=(first,))] if group is None else _group_pieces(inputs, group, token_budget)
        for piece in pieces:
            joined = MicroBatch(current.full + piece.full, current.shared + piece.shared)
            if current.rows and joined.tokens(inputs) > token_budget:
                batches.append(current)
                joined = piece
            current = joined
    if current.rows:
        batches.append(current)
    return batches


def _group_pieces(inputs: Sequence[DatumInputs], group: PrefixGroup, token_budget: int) -> list[MicroBatch]:
    """``group`` as one micro-batch, or as consecutive chunks of its rows that each fit the budget."""
    whole = MicroBatch(shared=(group,))
    if whole.tokens(inputs) <= token_budget:
        return [whole]
    suffix = max(len(inputs[i].tokens) for i in group.rows) - group.length
    size = max((token_budget - group.length) // suffix, 1)
    chunks = [group.rows[k : k + size] for k in range(0, len(group.rows), size)]
    return [
        MicroBatch(shared=(PrefixGroup(rows, group.length),)) if len(rows) >= 2 else MicroBatch(full=rows)
        for rows in chunks
    ]


def right_padded(inputs: Sequence[DatumInputs]) -> tuple[Tensor, Tensor]:
    """The input tokens as one right-padded ``[rows, width]`` batch, and each row's length."""
    lengths = torch.tensor([len(d.tokens) for d in inputs])
    tokens = torch.zeros(len(inputs), int(lengths.max()), dtype=torch.long)
    for i, datum in enumerate(inputs):
        tokens[i, : len(datum.tokens)] = torch.tensor(datum.tokens)
    return tokens, lengths


def forward_backward_parts(
    inputs: Sequence[DatumInputs],
    parts: Sequence[MicroBatch],
    target_logprobs: Callable[[MicroBatch], list[Tensor]],
    loss_fn: str,
    config: Mapping[str, float],
) -> tinker_types.ForwardBackwardOutput:
    """Accumulate the gradients of ``loss_fn`` over ``inputs``, one forward/backward pass per part.

    Args:
        inputs: the checked batch.
        parts: the micro-batches, each run as one pass (see :func:`micro_batches`).
        target_logprobs: the learner's ``[len]`` target logprobs, with grad, of
            each datum of a micro-batch, in the order of its ``rows``.
        loss_fn: a key of :data:`.losses.LOSS_FUNCTIONS`.
        config: the loss's clip thresholds.

    Returns:
        Per datum ``logprobs`` and ``elementwise_loss``, the metric ``loss:sum``
        and, for a loss with advantages, the importance weights' statistics
        (:func:`.offpolicy.weight_statistics`).
    """
    logprobs: list[Tensor] = [torch.empty(0)] * len(inputs)
    losses: list[Tensor] = [torch.empty(0)] * len(inputs)
    total = 0.0
    correction = parse_correction(config) if loss_fn == "importance_sampling" else Correction()
    statistics: dict[str, float] = {}
    for part in parts:
        order = part.rows
        data = [inputs[i] for i in order]
        with torch.enable_grad():
            rows = target_logprobs(part)
            per_datum = datum_losses(rows, data, loss_fn, config)
            loss = torch.stack([x.sum() for x in per_datum]).sum()
            loss.backward()  # type: ignore[no-untyped-call]
        total += float(loss.detach())
        for i, lp, x in zip(order, rows, per_datum, strict=True):
            logprobs[i], losses[i] = lp.detach(), x.detach()
            tensors = inputs[i].tensors
            if "advantages" in tensors and "logprobs" in tensors:
                # On the CPU, in float64: exact sums, and no float64 needed on the device (MPS has none).
                add_reduced(statistics, weight_statistics(lp.detach().cpu(), tensors, correction))
    return _tinker_compat.forward_backward_output(datum_outputs(logprobs, losses), {"loss:sum": total, **statistics})
