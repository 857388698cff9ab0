"""HFBackend sampling: shapes, logprobs against a plain forward pass, seeds, stops, greedy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from tinker import types as tinker_types

from tests.hf_helpers import backend, training_client
from tests.integration.tiny_model import TinyModel
from trio_rl.backends import EngineSettings


def _prompt(tokenizer: Any, text: str) -> tinker_types.ModelInput:
    return tinker_types.ModelInput.from_ints(tokenizer.encode(text))


def _plain_logprobs(model: Any, tokens: list[int]) -> list[float]:
    """Logprob of each token after the first, from one unbatched forward pass."""
    with torch.no_grad():
        x = torch.tensor([tokens])
        logits = model(input_ids=x).logits[0, :-1].double()
        return torch.log_softmax(logits, -1).gather(1, x[0, 1:, None])[:, 0].tolist()


async def test_samples_have_the_asked_shape_and_logprobs_of_a_plain_forward_pass(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    async with training_client(tmp_path, tiny_model.path) as (_, trainer):
        tok = await trainer.get_tokenizer()
        sampler = await trainer.save_weights_for_sampler("s0")
        prompt = _prompt(tok, "What is 3 + 4? Answer:")
        response = await sampler.sample(prompt, 3, tinker_types.SamplingParams(max_tokens=7, stop=[], seed=1))
        assert len(response.sequences) == 3
        for seq in response.sequences:
            assert len(seq.tokens) == len(seq.logprobs or []) == 7 and seq.stop_reason == "length"
            full = prompt.to_ints() + list(seq.tokens)
            expected = _plain_logprobs(trainer.model, full)[-7:]
            assert seq.logprobs == pytest.approx(expected, abs=1e-4)
            scored = await sampler.compute_logprobs(tinker_types.ModelInput.from_ints(full))
            assert scored[0] is None and scored[1:] == pytest.approx(_plain_logprobs(trainer.model, full), abs=1e-5)
        # Three samples of one request are drawn independently.
        assert len({tuple(s.tokens) for s in response.sequences}) > 1


async def test_seeded_request_repeats_alone_and_among_other_requests(tmp_path: Path, tiny_model: TinyModel) -> None:
    params = tinker_types.SamplingParams(max_tokens=10, stop=[], seed=1234)
    async with training_client(tmp_path, tiny_model.path) as (_, trainer):
        tok = await trainer.get_tokenizer()
        sampler = await trainer.save_weights_for_sampler("s0")
        prompt = _prompt(tok, "hello world")
        alone = await sampler.sample(prompt, 2, params)
        results: dict[str, tinker_types.SampleResponse] = {}

        async def ask(key: str, text: str, n: int, p: tinker_types.SamplingParams) -> None:
            results[key] = await sampler.sample(_prompt(tok, text), n, p)

        async with trio.open_nursery() as nursery:  # companions of other lengths, joining mid-decode
            nursery.start_soon(ask, "long", "the quick brown fox jumps over the lazy dog", 3,
                               tinker_types.SamplingParams(max_tokens=14, stop=[], seed=5))
            nursery.start_soon(ask, "same", "hello world", 2, params)
            nursery.start_soon(ask, "short", "0", 4, tinker_types.SamplingParams(max_tokens=3, stop=[], seed=6))
        batched = results["same"]
        assert [s.tokens for s in batched.sequences] == [s.tokens for s in alone.sequences]
        for a, b in zip(alone.sequences, batched.sequences, strict=True):
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        other_seed = await sampler.sample(prompt, 2, tinker_types.SamplingParams(max_tokens=10, stop=[], seed=99))
        assert [s.tokens for s in other_seed.sequences] != [s.tokens for s in alone.sequences]


async def test_stop_strings_stop_tokens_and_greedy(tmp_path: Path, tiny_model: TinyModel) -> None:
    async with training_client(tmp_path, tiny_model.path) as (_, trainer):
        tok = await trainer.get_tokenizer()
        sampler = await trainer.save_weights_for_sampler("s0")
        prompt = _prompt(tok, "abc")
        free = await sampler.sample(prompt, 1, tinker_types.SamplingParams(max_tokens=20, stop=[], seed=3))
        tokens = list(free.sequences[0].tokens)
        # Stop at a string the free run produced: the same sample, cut just after the string.
        text = tok.decode(tokens)
        stop = text[len(tok.decode(tokens[:4])):][:2] or text[-1]
        cut = await sampler.sample(prompt, 1, tinker_types.SamplingParams(max_tokens=20, stop=[stop], seed=3))
        seq = cut.sequences[0]
        assert seq.stop_reason == "stop" and stop in tok.decode(seq.tokens)
        assert list(seq.tokens) == tokens[: len(seq.tokens)]
        assert stop not in tok.decode(list(seq.tokens)[:-1])
        # A stop token id.
        by_id = await sampler.sample(prompt, 1, tinker_types.SamplingParams(max_tokens=20, stop=[tokens[5]], seed=3))
        assert list(by_id.sequences[0].tokens) == tokens[: tokens.index(tokens[5]) + 1]
        assert by_id.sequences[0].stop_reason == "stop"
        # Greedy equals Hugging Face's own greedy generate (the fresh adapter changes nothing).
        greedy = await sampler.sample(prompt, 2, tinker_types.SamplingParams(max_tokens=12, stop=[], temperature=0.0))
        with torch.no_grad():
            x = torch.tensor([prompt.to_ints()])
            reference = trainer.model.generate(
                input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=12, do_sample=False,
                eos_token_id=None, pad_token_id=tiny_model.eos_token_id,
            )[0, x.shape[1]:].tolist()
        assert [list(s.tokens) for s in greedy.sequences] == [reference, reference]
        top1 = await sampler.sample(prompt, 1, tinker_types.SamplingParams(max_tokens=12, stop=[], top_k=1, seed=8))
        assert list(top1.sequences[0].tokens) == reference


async def test_bad_requests_fail_clearly(tmp_path: Path, tiny_model: TinyModel) -> None:
    async with training_client(tmp_path, tiny_model.path, max_seq_len=32) as (_, trainer):
        sampler = await trainer.save_weights_for_sampler("s0")
        with pytest.raises(ValueError, match="outside"):
            await sampler.sample(tinker_types.ModelInput.from_ints([10**6]), 1, tinker_types.SamplingParams())
        with pytest.raises(ValueError, match="max_seq_len 32"):
            await sampler.sample(tinker_types.ModelInput.from_ints([5] * 40), 1, tinker_types.SamplingParams())
        # max_seq_len caps the sample: 30 prompt tokens leave room for 2.
        resp = await sampler.sample(tinker_types.ModelInput.from_ints([5] * 30), 1, tinker_types.SamplingParams(max_tokens=10, stop=[]))
        assert len(resp.sequences[0].tokens) == 2 and resp.sequences[0].stop_reason == "length"


def test_unsorted_pick_draws_from_the_same_distribution_as_the_sorted_one() -> None:
    from trio_rl.backends.hf.sampler import pick_tokens_unsorted
    from trio_rl.backends.local.batching import pick_tokens

    probs = torch.tensor([0.1, 0.5, 0.05, 0.3, 0.05], dtype=torch.float64)
    rows = 4000
    logits = probs.log().expand(rows, -1)
    temperature = torch.ones(rows, dtype=torch.float64)
    no_k, no_p = torch.full((rows,), -1), torch.ones(rows, dtype=torch.float64)
    uniform = torch.rand(rows, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    tokens, logprobs = pick_tokens_unsorted(logits, temperature, no_k, no_p, uniform)
    counts = torch.bincount(tokens, minlength=5).double() / rows
    assert counts.tolist() == pytest.approx(probs.tolist(), abs=0.03)
    assert logprobs.tolist() == pytest.approx(probs.log()[tokens].tolist())
    # Greedy and truncated rows are exactly what the sorted pick gives.
    temperature[:10] = 0.0
    k = no_k.clone()
    k[10:20] = 2
    p = no_p.clone()
    p[20:30] = 0.7
    fast, fast_lp = pick_tokens_unsorted(logits, temperature, k, p, uniform)
    slow, slow_lp = pick_tokens(logits, temperature, k, p, uniform)
    assert torch.equal(fast[:30], slow[:30]) and torch.equal(fast_lp[:30], slow_lp[:30])
    assert set(fast[10:30].tolist()) <= {1, 3}


async def test_prefix_cache_gives_the_same_tokens_and_logprobs_as_no_cache(
    tmp_path: Path, tiny_model: TinyModel
) -> None:
    texts = ["What is 3 + 4? Answer:", "Say hi", "What is 3 + 4? Answer: 7. And 5 + 1?"]

    async def rollouts(log_dir: Path, **kwargs: Any) -> list[tinker_types.SampleResponse]:
        out: dict[int, tinker_types.SampleResponse] = {}
        async with backend(log_dir, **kwargs) as be:
            trainer = await be.create_training_client(base_model=tiny_model.path, lora_rank=4, seed=0)
            tok = await trainer.get_tokenizer()
            sampler = await trainer.save_weights_for_sampler("s0")

            async def one(i: int) -> None:
                params = tinker_types.SamplingParams(max_tokens=6, seed=10 + i, stop=[])
                out[i] = await sampler.sample(_prompt(tok, texts[i % 3]), 1, params)

            for wave in range(2):
                async with trio.open_nursery() as nursery:
                    for i in range(6 * wave, 6 * wave + 6):
                        nursery.start_soon(one, i)
        return [out[i] for i in range(12)]

    with trio.fail_after(120):
        cached = await rollouts(tmp_path / "cached")
        plain = await rollouts(tmp_path / "plain", engine=EngineSettings(prefix_cache_bytes=0))
    for a, b in zip(cached, plain, strict=True):
        assert a.sequences[0].tokens == b.sequences[0].tokens
        assert a.sequences[0].logprobs == pytest.approx(b.sequences[0].logprobs, abs=1e-4)
    # Each prompt is prefilled once: the request that arrived first pays, every other one is a hit.
    for k in range(3):
        assert sorted(r.prompt_cache_hit_tokens > 0 for r in cached[k::3]) == [False, True, True, True]
    # Without a kept cache the second wave prefills each prompt again.
    assert sorted(r.prompt_cache_hit_tokens > 0 for r in plain[6:12]) == [False] * 3 + [True] * 3
