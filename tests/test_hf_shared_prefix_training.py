"""HFBackend's forward_backward runs a prefix shared by several data once, with the same results.

Compared with every datum run whole (float32 on the CPU): per-token logprobs
and losses within 1e-5 or a relative 1e-6 (the peaked model's losses reach 15),
the summed loss within a relative 1e-5, and each trained gradient tensor within
1e-5 of its largest element (the peaked model's gradients reach 10-60, so a
fixed absolute tolerance would say little).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from tinker import types as tinker_types

from tests.hf_helpers import datum, forward_backward_once
from tests.integration.tiny_model import TinyModel
from trio_rl.backends.hf import training
from trio_rl.backends.local.batch_inputs import DatumInputs, MicroBatch, PrefixGroup, micro_batches, prefix_groups


def _assert_close_at_scale(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """Every element within 1e-5 of the tensor's largest (float32 sums in another order)."""
    scale = float(want.abs().max())
    assert scale > 0, name
    assert float((got - want).abs().max()) <= 1e-5 * scale, name


def _tokens(seed: int, n: int, vocab: int = 300) -> list[int]:
    return torch.randint(1, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _inputs(seqs: list[list[int]]) -> list[DatumInputs]:
    return [DatumInputs(s, {}) for s in seqs]


def test_prefix_groups_pair_each_prompt_with_its_samples() -> None:
    system = _tokens(0, 10)
    prompts = [system + _tokens(10 + k, 6) for k in range(3)]
    # Samples start with different tokens, so a group shares exactly its prompt.
    seqs = [[*p, s + 1, *_tokens(20 + 3 * k + s, 2 + s)] for k, p in enumerate(prompts) for s in range(3)]
    seqs.append(_tokens(99, 14))  # nothing in common with the rest
    groups = prefix_groups(_inputs(seqs), min_length=8)
    # Per prompt (3 x 2 x 16 tokens saved), not all nine on the system prompt (8 x 10).
    assert groups == [PrefixGroup((0, 1, 2), 16), PrefixGroup((3, 4, 5), 16), PrefixGroup((6, 7, 8), 16)]


def test_prefix_groups_share_a_conversation_and_leave_each_datum_a_token() -> None:
    conversation = _tokens(1, 40)
    turns = [conversation[:n] for n in (18, 29, 40)]  # each turn's input holds the one before
    groups = prefix_groups(_inputs([*turns, _tokens(2, 30)]), min_length=8)
    # The three together (2 x 17 tokens saved) beat the last two alone (28).
    assert groups == [PrefixGroup((0, 1, 2), 17)]


def test_prefix_groups_skip_short_prefixes_and_lone_data() -> None:
    short = _tokens(3, 5)
    seqs = [short + _tokens(4, 6), short + _tokens(5, 6), _tokens(6, 20)]
    assert prefix_groups(_inputs(seqs), min_length=8) == []
    assert prefix_groups(_inputs(seqs), min_length=5) == [PrefixGroup((0, 1), 5)]


def test_micro_batches_count_a_shared_prefix_once() -> None:
    prompts = [_tokens(7, 30), _tokens(8, 30)]
    seqs = [p + _tokens(9 + 4 * k + s, 5) for k, p in enumerate(prompts) for s in range(4)]
    inputs = _inputs(seqs)
    # Run whole, the 8 x 35 positions need 280; shared, 2 x 30 + 8 x 5 = 100.
    assert micro_batches(inputs, 100, min_prefix=8) == [
        MicroBatch(shared=(PrefixGroup((0, 1, 2, 3), 30), PrefixGroup((4, 5, 6, 7), 30)))
    ]
    assert len(micro_batches(inputs, 100)) == 4  # two whole data a micro-batch
    for budget, count in ((60, 2), (40, 4)):  # 40: each group split into pairs that fit
        batches = micro_batches(inputs, budget, min_prefix=8)
        assert sorted(i for b in batches for i in b.rows) == list(range(8))
        assert len(batches) == count
        assert all(b.tokens(inputs) <= budget and b.shared and not b.full for b in batches)


def _model_batch(vocab: int) -> tuple[list[list[int]], list[int]]:
    """Token sequences and their prompt lengths: groups of several prompt lengths, a group of one,
    data sharing nothing, and a conversation's turns."""
    seqs: list[list[int]] = []
    prompt_lengths: list[int] = []
    for k, (length, samples) in enumerate(((12, 4), (20, 3), (15, 1))):
        prompt = _tokens(100 + k, length, vocab)
        for s in range(samples):
            seqs.append([*prompt, s + 1, *_tokens(200 + 10 * k + s, 1 + s % 4, vocab)])
            prompt_lengths.append(length)
    seqs += [_tokens(300, 9, vocab), _tokens(301, 13, vocab)]
    prompt_lengths += [4, 6]
    conversation = _tokens(400, 41, vocab)
    for n, asked in ((19, 14), (30, 25), (41, 36)):
        seqs.append(conversation[:n])
        prompt_lengths.append(asked)
    return seqs, prompt_lengths


def _data(loss_fn: str, vocab: int) -> list[tinker_types.Datum]:
    seqs, prompt_lengths = _model_batch(vocab)
    data = []
    for i, (seq, prompt) in enumerate(zip(seqs, prompt_lengths, strict=True)):
        n = len(seq) - 1
        if loss_fn == "cross_entropy":  # every position scored, the shared prompt's too
            data.append(datum(seq, weights=[1.0 + 0.1 * (j % 3) for j in range(n)]))
            continue
        answer = range(prompt - 1, n)
        adv = [(0.5 + 0.1 * i) * (-1) ** i if j in answer else 0.0 for j in range(n)]
        old = [-3.0 - 0.05 * j if j in answer else 0.0 for j in range(n)]
        data.append(datum(seq, advantages=adv, logprobs=old))
    return data


def _count_shared_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    rows: list[int] = []
    run = training.shared_target_logprobs

    def counting(model: Any, inputs: Any, groups: Any, device: Any, loss_fn: str) -> Any:
        rows.extend(i for g in groups for i in g.rows)
        return run(model, inputs, groups, device, loss_fn)

    monkeypatch.setattr(training, "shared_target_logprobs", counting)
    return rows


ALL_SHARED = [0, 1, 2, 3, 4, 5, 6, 10, 11, 12]
"""Rows of :func:`_model_batch` in groups: the two of several samples and the conversation."""


@pytest.mark.parametrize(
    ("loss_fn", "token_budget", "shared"),
    [
        ("importance_sampling", 4096, ALL_SHARED),
        ("cross_entropy", 4096, ALL_SHARED),
        # Four micro-batches; the conversation's group split, its last turn run whole.
        ("importance_sampling", 70, ALL_SHARED[:-1]),
    ],
)
async def test_shared_prefixes_give_the_logprobs_loss_and_gradients_of_whole_data(
    tmp_path: Path,
    peaked_tiny_model: TinyModel,
    monkeypatch: pytest.MonkeyPatch,
    loss_fn: str,
    token_budget: int,
    shared: list[int],
) -> None:
    data = _data(loss_fn, peaked_tiny_model.vocab_size)
    with trio.fail_after(120):
        with monkeypatch.context() as whole:
            whole.setattr(training, "MIN_SHARED_PREFIX", 10**9)
            whole_run = await forward_backward_once(tmp_path / "whole", peaked_tiny_model, data, loss_fn, 4096)
            expected, expected_grads = whole_run
        shared_rows = _count_shared_rows(monkeypatch)
        out, grads = await forward_backward_once(tmp_path / "shared", peaked_tiny_model, data, loss_fn, token_budget)
    assert sorted(shared_rows) == shared  # a group of one and data sharing nothing ran whole
    assert out.metrics["loss:sum"] == pytest.approx(expected.metrics["loss:sum"], rel=1e-5)
    for got, want in zip(out.loss_fn_outputs, expected.loss_fn_outputs, strict=True):
        for key in ("logprobs", "elementwise_loss"):
            assert got[key].tolist() == pytest.approx(want[key].tolist(), rel=1e-6, abs=1e-5)
    assert grads.keys() == expected_grads.keys() and grads and all(".lora_" in n for n in grads)
    for n in grads:
        _assert_close_at_scale(grads[n], expected_grads[n], n)


def _tiny(family: str, attn: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[family]
    config = config_cls(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, initializer_range=0.5,
        attn_implementation=attn,
    )  # fmt: skip
    torch.manual_seed(0)
    return model_cls(config).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_every_weight_gets_the_gradient_of_whole_data(family: str, attn: str) -> None:
    """Full fine-tuning of a tiny Llama (SmolLM2's family) and Qwen3: every parameter's gradient."""
    model = _tiny(family, attn)
    assert training.shares_prefixes(model)
    seqs, _ = _model_batch(300)
    inputs = [
        DatumInputs(s[:-1], {"target_tokens": torch.tensor(s[1:]), "weights": torch.ones(len(s) - 1)}) for s in seqs
    ]
    results = []
    for min_prefix in (8, 0):
        model.zero_grad(set_to_none=True)
        logprobs: dict[int, torch.Tensor] = {}
        for part in micro_batches(inputs, 4096, min_prefix=min_prefix):
            assert bool(part.shared) == bool(min_prefix)
            rows = training.part_logprobs(model, inputs, part, torch.device("cpu"), "cross_entropy")
            torch.stack([-lp.sum() for lp in rows]).sum().backward()  # type: ignore[no-untyped-call]
            logprobs.update((i, lp.detach()) for i, lp in zip(part.rows, rows, strict=True))
        results.append((logprobs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (shared, shared_grads), (whole, whole_grads) = results
    for i in whole:
        torch.testing.assert_close(shared[i], whole[i], rtol=0, atol=1e-5)
    assert shared_grads.keys() == whole_grads.keys() == {n for n, _ in model.named_parameters()}
    for n in whole_grads:
        _assert_close_at_scale(shared_grads[n], whole_grads[n], n)


def test_models_whose_cache_or_logits_differ_run_every_datum_whole() -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    sliding = Qwen3Config(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, use_sliding_window=True, sliding_window=8, max_window_layers=0,
    )  # fmt: skip
    assert not training.shares_prefixes(Qwen3ForCausalLM(sliding))
    capped = _tiny("llama", "sdpa")
    capped.config.final_logit_softcapping = 30.0
    assert not training.shares_prefixes(capped)


def test_groups_run_whole_when_the_cache_is_not_plain_keys_and_values(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _tiny("qwen3", "sdpa")
    seqs, _ = _model_batch(300)
    inputs = [DatumInputs(s[:-1], {"target_tokens": torch.tensor(s[1:])}) for s in seqs]
    (part,) = micro_batches(inputs, 4096, min_prefix=8)
    assert part.shared
    shared = training.part_logprobs(model, inputs, part, torch.device("cpu"), "cross_entropy")
    monkeypatch.setattr(training, "_repeat_rows", lambda cache, owner, prefixes: False)
    whole = training.part_logprobs(model, inputs, part, torch.device("cpu"), "cross_entropy")
    assert len(whole) == len(shared) == len(part.rows)
    for got, want in zip(whole, shared, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
