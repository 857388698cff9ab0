"""HFBackend training: every loss against hand-computed values, micro-batching, AdamW's fields."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from tinker import types as tinker_types

from tests.hf_helpers import datum, forward_backward_once, training_client
from tests.integration.tiny_model import TinyModel
from trio_rl.backends.hf.training import micro_batches
from trio_rl.backends.local.batch_inputs import DatumInputs

SEQS = [[5, 17, 42, 99, 7, 3], [8, 8, 100, 250, 1], [300, 12]]


def _target_logprobs(model: Any, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        x = torch.tensor([tokens[:-1]])
        logits = model(input_ids=x).logits[0].double()
        return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]


def _inputs(seq: list[int], i: int) -> dict[str, list[float]]:
    n = len(seq) - 1
    return {
        "weights": [1.0 if j % 2 == 0 else 0.5 for j in range(n)],
        "logprobs": [-5.0 - 0.3 * j - i for j in range(n)],
        "advantages": [(-1.0) ** j * (0.5 + i) for j in range(n)],
    }


def _expected(loss_fn: str, lp: torch.Tensor, inp: dict[str, list[float]]) -> torch.Tensor:
    w, old, adv = (torch.tensor(inp[k], dtype=torch.float64) for k in ("weights", "logprobs", "advantages"))
    r = torch.exp(lp - old)
    if loss_fn == "cross_entropy":
        return -lp * w
    if loss_fn == "importance_sampling":
        return -r * adv * w
    if loss_fn == "ppo":
        return -torch.minimum(r * adv, r.clamp(0.8, 1.2) * adv) * w
    return -r.clamp(0.8, 1.2) * lp * adv * w  # cispo: the clipped ratio is a constant factor


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling", "ppo", "cispo"])
async def test_every_loss_matches_hand_computed_values(tmp_path: Path, tiny_model: TinyModel, loss_fn: str) -> None:
    async with training_client(tmp_path, tiny_model.path) as (_, trainer):
        data, expected = [], []
        for i, seq in enumerate(SEQS):
            inp = _inputs(seq, i)
            lp = _target_logprobs(trainer.model, seq)
            # Sampler logprobs near the learner's, some ratios outside [0.8, 1.2] so clipping is exercised.
            inp["logprobs"] = (lp + torch.tensor([0.5, -0.5, 0.05, 0.0, 0.3][: len(lp)])).tolist()
            keys = ("weights",) if loss_fn == "cross_entropy" else ("weights", "logprobs", "advantages")
            data.append(datum(seq, **{k: inp[k] for k in keys}))
            expected.append((lp, _expected(loss_fn, lp, inp)))
        out = await (await trainer.forward_backward(data, loss_fn)).result()
        total = sum(float(e.sum()) for _, e in expected)
        assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-4, abs=1e-4)
        for got, (lp, per_token) in zip(out.loss_fn_outputs, expected, strict=True):
            assert got["logprobs"].tolist() == pytest.approx(lp.tolist(), abs=1e-4)
            assert got["elementwise_loss"].tolist() == pytest.approx(per_token.tolist(), rel=1e-3, abs=1e-4)


def test_micro_batches_respect_the_token_budget() -> None:
    lengths = [3, 5, 2, 8, 1, 1, 9]
    inputs = [DatumInputs([0] * n, {}) for n in lengths]
    batches = micro_batches(inputs, token_budget=10)
    assert [i for b in batches for i in b.rows] == list(range(len(lengths)))  # order kept, nothing lost
    for b in batches:
        assert not b.shared
        assert len(b.rows) == 1 or max(lengths[i] for i in b.rows) * len(b.rows) <= 10


async def test_micro_batched_gradients_equal_one_batch(tmp_path: Path, tiny_model: TinyModel) -> None:
    data = [datum(seq, weights=[1.0] * (len(seq) - 1)) for seq in SEQS]
    with trio.fail_after(60):
        (out_a, ga), (out_b, gb) = [
            await forward_backward_once(tmp_path / str(budget), tiny_model, data, "cross_entropy", budget)
            for budget in (4096, 6)
        ]
    assert out_a.metrics["loss:sum"] == pytest.approx(out_b.metrics["loss:sum"], rel=1e-5)
    assert ga.keys() == gb.keys() and ga and all(".lora_" in n for n in ga)
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-4, atol=1e-6)


async def test_optim_step_is_adamw_with_every_field(tmp_path: Path, tiny_model: TinyModel) -> None:
    """Two steps with different AdamParams against torch.optim.AdamW plus clip_grad_norm_."""
    steps = [
        tinker_types.AdamParams(learning_rate=1e-2, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.5),
        tinker_types.AdamParams(learning_rate=3e-3, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.0),
    ]
    data = [datum(seq, weights=[1.0] * (len(seq) - 1)) for seq in SEQS]
    async with training_client(tmp_path, tiny_model.path) as (_, trainer):
        trained = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
        frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
        mirror = {n: p.detach().clone().requires_grad_(True) for n, p in trained.items()}
        reference = torch.optim.AdamW(list(mirror.values()), lr=1.0)
        for params in steps:
            await (await trainer.forward_backward(data, "cross_entropy")).result()
            norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in trained.values()))
            for n, p in trained.items():
                mirror[n].grad = p.grad.clone()
            out = await (await trainer.optim_step(params)).result()
            assert out.metrics["grad_norm"] == pytest.approx(norm, rel=1e-6)
            if params.grad_clip_norm:
                torch.nn.utils.clip_grad_norm_(list(mirror.values()), params.grad_clip_norm)
            for group in reference.param_groups:
                group.update(lr=params.learning_rate, betas=(params.beta1, params.beta2), eps=params.eps,
                             weight_decay=params.weight_decay)
            reference.step()
            for n, p in trained.items():
                torch.testing.assert_close(p.detach(), mirror[n].detach(), rtol=1e-4, atol=1e-6)
                assert p.grad is None
        # Only the adapter moved.
        for n, p in trainer.model.named_parameters():
            if n in frozen:
                assert torch.equal(p.detach(), frozen[n]), n
        assert any(not torch.equal(p.detach(), torch.zeros_like(p)) for n, p in trained.items() if "lora_B" in n)


async def test_malformed_data_and_unknown_losses_are_rejected(tmp_path: Path, tiny_model: TinyModel) -> None:
    async with training_client(tmp_path, tiny_model.path) as (_, trainer):
        with pytest.raises(ValueError, match="does not implement"):
            await trainer.forward_backward([], "dpo")
        pending = await trainer.forward_backward([datum([1, 2, 3])], "cross_entropy")
        with pytest.raises(ValueError, match="lacks loss_fn_inputs"):
            await pending.result()
        pending = await trainer.forward_backward([datum([1, 10**6], weights=[1.0])], "cross_entropy")
        with pytest.raises(ValueError, match="outside"):
            await pending.result()


async def test_skipping_the_prompt_positions_changes_no_trained_logprob_or_gradient(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    async with training_client(tmp_path, tiny_model.path) as (_, trainer):
        data, prompts = [], (3, 1, 0)
        for seq, prompt in zip(SEQS, prompts, strict=True):
            n = len(seq) - 1
            adv = [0.0] * prompt + [1.5] * (n - prompt)
            data.append(datum(seq, logprobs=[0.0] * prompt + [-5.0] * (n - prompt), advantages=adv))
        out = await (await trainer.forward_backward(data, "importance_sampling")).result()
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        assert grads
        trainer.model.zero_grad(set_to_none=True)
        # The reference: the full forward (the head at every position), the loss over all of them.
        total = torch.zeros(())
        for seq, prompt, d, got in zip(SEQS, prompts, data, out.loss_fn_outputs, strict=True):
            x = torch.tensor([seq[:-1]])
            logits = trainer.model(input_ids=x).logits[0].float()
            reference = torch.log_softmax(logits, -1).gather(1, torch.tensor(seq[1:])[:, None])[:, 0]
            old = torch.tensor(d.loss_fn_inputs["logprobs"].tolist())
            advantage = torch.tensor(d.loss_fn_inputs["advantages"].tolist())
            total = total + (-torch.exp(reference - old) * advantage).sum()
            assert got["logprobs"].tolist()[prompt:] == pytest.approx(reference[prompt:].tolist(), abs=1e-5)
            assert got["logprobs"].tolist()[:prompt] == [0.0] * prompt
        total.backward()  # type: ignore[no-untyped-call]
        assert out.metrics["loss:sum"] == pytest.approx(float(total), abs=1e-4)
        for n, p in trainer.model.named_parameters():
            if n in grads:
                assert torch.allclose(grads[n], p.grad, atol=1e-5), n
