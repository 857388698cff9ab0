"""The training client: ordering, Adam, version pinning, responsiveness."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import pytest
import torch
import trio
from tinker import types as tinker_types

from tests.local_helpers import CONFIG, TOK, local_backend, local_training_client, text_datum
from trio_rl import _tinker_compat as compat
from trio_rl.backends.local.model import TransformerLM
from trio_rl.backends.local.optimizer import AdamState, adam_step

ADAM = tinker_types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8)


BATCH = [text_datum("abc"), text_datum("hgfe dcba"), text_datum("a")]


def _grads_like(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_matches_torch_adamw(weight_decay: float) -> None:
    ours = TransformerLM(CONFIG, TOK.vocab_size, seed=0)
    ref = copy.deepcopy(ours)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    state = AdamState()
    params = tinker_types.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=weight_decay)
    for step in range(3):
        _grads_like(ours, step)
        _grads_like(ref, step)
        adam_step(ours, state, params)
        opt.step()
        opt.zero_grad()
    for (name, a), b in zip(ours.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=name)
        assert a.grad is None


def test_grad_clip_scales_global_norm() -> None:
    clipped = TransformerLM(CONFIG, TOK.vocab_size, seed=0)
    scaled = copy.deepcopy(clipped)
    _grads_like(clipped, 1)
    _grads_like(scaled, 1)
    norm = torch.stack([(p.grad.double() ** 2).sum() for p in scaled.parameters() if p.grad is not None]).sum().sqrt()
    for p in scaled.parameters():
        assert p.grad is not None
        p.grad *= 0.5 / (float(norm) + 1e-6)
    m1 = adam_step(clipped, AdamState(), ADAM.model_copy(update={"grad_clip_norm": 0.5}))
    adam_step(scaled, AdamState(), ADAM)
    assert m1["grad_norm"] == pytest.approx(float(norm))
    for a, b in zip(clipped.parameters(), scaled.parameters(), strict=True):
        torch.testing.assert_close(a, b)


async def test_requests_run_in_submission_order(tmp_path: Path) -> None:
    async with local_training_client(tmp_path, deadline_s=30) as (_, client):
        fb1 = await client.forward_backward(BATCH, "cross_entropy")
        opt = await client.optim_step(ADAM)
        fb2 = await client.forward_backward(BATCH, "cross_entropy")
        # Await the later ones first, concurrently; and abandon one wait midway.
        with trio.move_on_after(0):
            await fb1.result()
        out: dict[str, float] = {}

        async def wait(name: str, pending: object) -> None:
            out[name] = (await pending.result()).metrics["loss:sum"]  # type: ignore[attr-defined]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait, "fb2", fb2)
            nursery.start_soon(wait, "fb1", fb1)
        await opt.result()
    # fb2 ran after the optimizer step: a lower loss than fb1 on the same batch.
    assert out["fb2"] < out["fb1"]


async def test_sync_runs_are_bit_identical(tmp_path: Path) -> None:
    async def run(sub: str) -> list[torch.Tensor]:
        async with local_backend(tmp_path / sub) as backend:
            client = await backend.create_training_client(base_model="tiny", seed=3)
            for step in range(3):
                sampler = await client.save_weights_for_sampler(f"s{step}")
                resp = await sampler.sample(
                    tinker_types.ModelInput.from_ints([TOK.bos_token_id]),
                    4,
                    tinker_types.SamplingParams(max_tokens=8, seed=step),
                )
                data = []
                for s in resp.sequences:
                    seq = [TOK.bos_token_id, *s.tokens]
                    data.append(
                        tinker_types.Datum(
                            model_input=tinker_types.ModelInput.from_ints(seq[:-1]),
                            loss_fn_inputs={
                                "target_tokens": compat.tensor(seq[1:], "int64"),
                                "logprobs": compat.tensor(s.logprobs or [], "float32"),
                                "advantages": compat.tensor([1.0] * len(s.tokens), "float32"),
                            },
                        )
                    )
                await client.forward_backward(data, "ppo")
                await (await client.optim_step(ADAM)).result()
            return [p.detach().clone() for p in client.model.parameters()]

    with trio.fail_after(30):
        a = await run("a")
        b = await run("b")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


async def test_sampler_is_pinned_to_its_version(tmp_path: Path) -> None:
    prompt = tinker_types.ModelInput.from_ints([TOK.bos_token_id, *TOK.encode("ab")])
    params = tinker_types.SamplingParams(max_tokens=16, seed=11, stop=[])
    async with local_training_client(tmp_path, deadline_s=30) as (_, client):
        old = await client.save_weights_for_sampler("v0")
        assert old.model_path == str(tmp_path / "sampler_weights" / "v0")
        before = await old.sample(prompt, 2, params)
        before_lp = await old.compute_logprobs(prompt)
        for _ in range(3):
            await client.forward_backward(BATCH, "cross_entropy")
            await (await client.optim_step(ADAM.model_copy(update={"learning_rate": 0.1}))).result()
        after = await old.sample(prompt, 2, params)
        new = await client.save_weights_for_sampler("v1")
        changed = await new.sample(prompt, 2, params)
        assert await old.compute_logprobs(prompt) == before_lp
    assert [s.tokens for s in after.sequences] == [s.tokens for s in before.sequences]
    assert [s.logprobs for s in after.sequences] == [s.logprobs for s in before.sequences]
    assert [s.logprobs for s in changed.sequences] != [s.logprobs for s in before.sequences]


async def test_trio_stays_responsive_during_training(tmp_path: Path) -> None:
    big = [text_datum("abcdefgh " * 6) for _ in range(64)]
    ticks: list[float] = []
    async with local_training_client(tmp_path, deadline_s=30) as (_, client):

        async def heartbeat() -> None:
            while True:
                ticks.append(trio.current_time())
                await trio.sleep(0.005)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(heartbeat)
            await trio.sleep(0.02)
            start = trio.current_time()
            for _ in range(3):
                await (await client.forward_backward(big, "cross_entropy")).result()
            elapsed = trio.current_time() - start
            nursery.cancel_scope.cancel()
    during = [t for t in ticks if t >= start]
    assert elapsed > 0.05  # the work was long enough to notice a blocked loop
    gaps = [b - a for a, b in itertools.pairwise(during)]
    # A blocked loop would tick about once per request (3 times); a free one every ~5 ms.
    assert len(during) >= max(10, elapsed / 0.005 / 4)
    assert max(gaps) < elapsed / 2


async def test_unsupported_loss_is_rejected_at_submit(tmp_path: Path) -> None:
    async with local_backend(tmp_path) as backend:
        client = await backend.create_training_client(base_model="tiny", seed=0)
        with pytest.raises(ValueError):
            await client.forward_backward(BATCH, "dro")
        bad = tinker_types.Datum(
            model_input=tinker_types.ModelInput.from_ints([1, 2]),
            loss_fn_inputs={"target_tokens": compat.tensor([1, 2], "int64")},
        )
        pending = await client.forward_backward([bad], "cross_entropy")
        with pytest.raises(ValueError, match="weights"):
            await pending.result()
        # The queue goes on after a failed request.
        await (await client.optim_step(ADAM)).result()
        assert (await client.get_tokenizer()) == TOK


async def test_leaving_the_backend_fails_queued_requests(tmp_path: Path) -> None:
    big = [text_datum("abcdefgh " * 6) for _ in range(32)]
    with trio.fail_after(30):
        backend = local_backend(tmp_path)
        async with backend:
            client = await backend.create_training_client(base_model="tiny", seed=0)
            pendings = [await client.forward_backward(big, "cross_entropy") for _ in range(5)]
            with pytest.raises(RuntimeError, match="already entered"):
                async with backend:
                    pass
        # The block ended with work queued: the rest never runs and says so.
        with pytest.raises(RuntimeError, match="closed"):
            await pendings[-1].result()
        with pytest.raises(RuntimeError, match="async with"):
            await client.optim_step(ADAM)


def _rl_datum(seq: list[int], prompt: int, advantage: float) -> tinker_types.Datum:
    """A prompt of ``prompt`` targets (advantage 0, unmasked) then action targets with ``advantage``."""
    n = len(seq) - 1
    return tinker_types.Datum(
        model_input=tinker_types.ModelInput.from_ints(seq[:-1]),
        loss_fn_inputs={
            "target_tokens": compat.tensor(seq[1:], "int64"),
            "logprobs": compat.tensor([0.0] * prompt + [-1.0 - 0.1 * j for j in range(n - prompt)], "float32"),
            "advantages": compat.tensor([0.0] * prompt + [advantage] * (n - prompt), "float32"),
            "mask": compat.tensor([0.0] * prompt + [1.0] * (n - prompt), "float32"),
        },
    )


def test_skipping_the_prompt_positions_changes_no_trained_logprob_or_gradient() -> None:
    from trio_rl.backends.local.model import causal_mask
    from trio_rl.backends.local.training import forward_backward_batch

    model = TransformerLM(CONFIG, TOK.vocab_size, seed=3)
    seqs = [[TOK.bos_token_id, *TOK.encode(t), TOK.eos_token_id] for t in ("abcdefg", "hgf", "a b c d")]
    data = [_rl_datum(s, prompt, adv) for s, prompt, adv in zip(seqs, (4, 1, 3), (0.5, -1.0, 2.0), strict=True)]
    out = forward_backward_batch(model, data, "importance_sampling", {})
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    # The reference: the head over every position, the loss summed over all of them.
    total = torch.zeros(())
    for seq, datum, got in zip(seqs, data, out.loss_fn_outputs, strict=True):
        x = torch.tensor([seq[:-1]])
        logits, _ = model(x, torch.arange(x.shape[1])[None], causal_mask(torch.tensor([x.shape[1]]), x.shape[1]))
        lp = torch.log_softmax(logits[0], -1).gather(1, torch.tensor(seq[1:])[:, None])[:, 0]
        old = torch.tensor(datum.loss_fn_inputs["logprobs"].tolist())
        adv = torch.tensor(datum.loss_fn_inputs["advantages"].tolist())
        total = total + (-torch.exp(lp - old) * adv).sum()
        trained = adv != 0
        got_lp = torch.tensor(got["logprobs"].tolist())
        assert got_lp[trained].tolist() == pytest.approx(lp[trained].tolist(), abs=1e-6)
        assert got_lp[~trained].tolist() == [0.0] * int((~trained).sum())
    total.backward()  # type: ignore[no-untyped-call]
    assert out.metrics["loss:sum"] == pytest.approx(float(total), abs=1e-5)
    for n, p in model.named_parameters():
        assert p.grad is not None
        assert torch.allclose(grads[n], p.grad, atol=1e-6), n
