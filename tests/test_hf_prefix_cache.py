"""HFBackend's prefix cache on the tiny Qwen3: prompts that share a prefix prefill it once, and sample as without it."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from tinker import types as tinker_types

from tests.hf_helpers import backend, training_client
from tests.integration.tiny_model import TinyModel
from tests.prefill_helpers import count_prefilled_tokens, sample_each
from trio_rl.backends import EngineSettings

SYSTEM = "You answer with one number. Question: "


async def _sample(sampler: Any, prompt: list[int], seed: int) -> tinker_types.SampleResponse:
    params = tinker_types.SamplingParams(max_tokens=4, seed=seed, stop=[])
    response: tinker_types.SampleResponse = await sampler.sample(tinker_types.ModelInput.from_ints(prompt), 1, params)
    return response


async def _conversations(log_dir: Path, model: TinyModel, **kwargs: Any) -> tuple[list[Any], list[list[int]]]:
    """Four two-turn envs sharing a system prompt, in waves of concurrent requests.

    Returns:
        Every response and every prompt, in order.
    """
    out: list[tinker_types.SampleResponse] = []
    sent: list[list[int]] = []
    async with backend(log_dir, **kwargs) as be:
        trainer = await be.create_training_client(base_model=model.path, lora_rank=4, seed=0)
        tok = await trainer.get_tokenizer()
        sampler = await trainer.save_weights_for_sampler("s0")

        async def wave(prompts: list[list[int]], seed: int) -> list[tinker_types.SampleResponse]:
            responses = await sample_each(partial(_sample, sampler), prompts, seed)
            out.extend(responses)
            sent.extend(prompts)
            return responses

        system = tok.encode(SYSTEM)
        turn_one = [system + tok.encode(q) for q in ("3 + 4?", "5 + 1?", "3 + 4?", "What is 12 + 30?")]
        answers = await wave(turn_one, 10)
        turn_two = [
            [*p, *a.sequences[0].tokens, *tok.encode(f" And {i} + 2?")]
            for i, (p, a) in enumerate(zip(turn_one, answers, strict=True))
        ]
        await wave(turn_two, 20)
        await wave([system, system[:3]], 30)  # strict prefixes of kept prompts
        await wave(turn_two, 20)
    return out, sent


async def test_shared_prefixes_give_the_same_tokens_and_logprobs_as_no_cache(
    tmp_path: Path,
    peaked_tiny_model: TinyModel,  # peaked logits, so wrong keys would show
) -> None:
    with trio.fail_after(180):
        cached, prompts = await _conversations(tmp_path / "cached", peaked_tiny_model)
        plain, _ = await _conversations(tmp_path / "plain", peaked_tiny_model, engine=EngineSettings(prefix_cache_bytes=0))
        tight, _ = await _conversations(tmp_path / "tight", peaked_tiny_model, engine=EngineSettings(prefix_cache_bytes=24 << 10))
    for runs in zip(cached, plain, tight, strict=True):
        a, *others = (r.sequences[0] for r in runs)
        for b in others:
            assert a.tokens == b.tokens
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    hits = [r.prompt_cache_hit_tokens for r in cached]
    lengths = [len(p) for p in prompts]
    # Turn one, one admission batch: only env 0's and env 2's identical prompts share.
    assert sorted(hits[0:3:2]) == [0, lengths[0]] and hits[1] == hits[3] == 0
    # Turn two: each env's turn-one prompt is cached.
    assert hits[4:8] == lengths[0:4]
    # Strict prefixes of kept prompts: all but their last token.
    assert hits[8:10] == [lengths[8] - 1, 2]
    # The second turn again: whole prompts, with their logits.
    assert hits[10:14] == lengths[4:8]
    assert all(r.prompt_cache_hit_tokens == 0 for r in plain[4:10])
    assert sum(r.prompt_cache_hit_tokens for r in tight) < sum(hits)


async def test_a_turn_two_prompt_prefills_only_its_new_tokens(
    tmp_path: Path,
    peaked_tiny_model: TinyModel,
) -> None:
    async with training_client(tmp_path, peaked_tiny_model.path, deadline_s=120) as (_, trainer):
        tok = await trainer.get_tokenizer()
        sampler = await trainer.save_weights_for_sampler("s0")
        passes = count_prefilled_tokens(sampler)
        turn_one = tok.encode(SYSTEM + "3 + 4?")
        first = await _sample(sampler, turn_one, 1)
        turn_two = [*turn_one, *first.sequences[0].tokens, *tok.encode(" And 2 + 2?")]
        second = await _sample(sampler, turn_two, 2)
        inside = await _sample(sampler, turn_one[:5], 3)
        again = await _sample(sampler, turn_one[:5], 3)
    assert (first.prompt_cache_hit_tokens, second.prompt_cache_hit_tokens) == (0, len(turn_one))
    assert (inside.prompt_cache_hit_tokens, again.prompt_cache_hit_tokens) == (4, 5)
    assert passes == [[len(turn_one)], [len(turn_two) - len(turn_one)], [1]]
    assert again.sequences[0].tokens == inside.sequences[0].tokens
