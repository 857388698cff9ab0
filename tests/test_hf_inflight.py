"""HFBackend's in-flight weights on the tiny Qwen3 (LoRA): versions per token, KV kept or recomputed, cache, memory."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
import trio
from tinker import types as tinker_types

from tests.hf_helpers import backend, datum, training_client
from tests.inflight_helpers import fresh_logprobs, span_a_publish
from tests.integration.tiny_model import TinyModel
from trio_rl.backends import EngineSettings
from trio_rl.backends.protocol import check_inflight_before_work, token_versions

SPAN = tinker_types.SamplingParams(max_tokens=8, seed=7, stop=[])
PUBLISH_AFTER = 3  # decode steps; step 1 prefills and picks the first token
TEXTS = ["What is 3 + 4? Answer:", "Say hi"]


async def _train_one_step(trainer: Any, tok: Any) -> None:
    """One large Adam step on the adapter, so the next weights sample visibly differently."""
    tokens = tok.encode("What is 3 + 4? Answer: 7")
    data = [datum(tokens, weights=[1.0] * (len(tokens) - 1))]
    await (await trainer.forward_backward(data, "cross_entropy")).result()
    await (await trainer.optim_step(tinker_types.AdamParams(learning_rate=0.05))).result()


async def _span_a_publish(be: Any, model: TinyModel) -> tuple[list[tuple[list[int], Any]], Any, Any]:
    """Sample TEXTS (2 and 1 samples) on a v0 in-flight client while v1 is published after PUBLISH_AFTER steps.

    Returns:
        Each sequence with its prompt, and pinned snapshots of v0 and v1.
    """
    trainer = await be.create_training_client(base_model=model.path, lora_rank=4, seed=0)
    tok = await trainer.get_tokenizer()
    prompts = [tok.encode(text) for text in TEXTS]
    responses, v0, v1 = await span_a_publish(
        be,
        trainer,
        [(prompts[0], 2), (prompts[1], 1)],
        train_one_step=lambda: _train_one_step(trainer, tok),
        params=SPAN,
        after_step=PUBLISH_AFTER,
    )
    return (
        [(prompt, seq) for prompt, response in zip(prompts, responses, strict=True) for seq in response.sequences],
        v0,
        v1,
    )


async def _scored_across_a_publish(be: Any, model: TinyModel) -> list[tuple[list[float], list[float], list[float]]]:
    """Each sequence of :func:`_span_a_publish`'s logprobs, and those of fresh passes of the old and new weights.

    Checks what holds with and without KV recomputation: each token's version, and
    that the tokens before the publish have the old weights' logprobs.
    """
    sequences, v0, v1 = await _span_a_publish(be, model)
    scored = []
    for prompt, seq in sequences:
        assert token_versions(seq) == [0] * PUBLISH_AFTER + [1] * (8 - PUBLISH_AFTER)
        logprobs = list(seq.logprobs or [])
        old = await fresh_logprobs(v0, prompt, list(seq.tokens))
        assert logprobs[:PUBLISH_AFTER] == pytest.approx(old[:PUBLISH_AFTER], abs=1e-4)
        scored.append((logprobs, old, await fresh_logprobs(v1, prompt, list(seq.tokens))))
    return scored


def test_hf_backend_offers_inflight_weights(tmp_path: Path) -> None:
    be = backend(tmp_path)
    be.check_inflight_weights()
    check_inflight_before_work(be)


async def test_a_sequence_spanning_a_publish_carries_both_versions_and_keeps_its_kv(
    tmp_path: Path,
    peaked_tiny_model: TinyModel,
) -> None:
    kept_differs = False
    with trio.fail_after(120):
        async with backend(tmp_path) as be:
            for logprobs, _old, new in await _scored_across_a_publish(be, peaked_tiny_model):
                kept_differs |= any(abs(logprobs[i] - new[i]) > 1e-2 for i in range(PUBLISH_AFTER, 8))
    # The new weights read keys and values computed by the old ones: not a fresh pass of the new weights.
    assert kept_differs


async def test_with_kv_recomputation_each_logprob_is_a_fresh_pass_of_the_weights_that_produced_it(
    tmp_path: Path,
    peaked_tiny_model: TinyModel,
) -> None:
    with trio.fail_after(120):
        async with backend(tmp_path, engine=EngineSettings(inflight_recompute_kv=True)) as be:
            scored = await _scored_across_a_publish(be, peaked_tiny_model)
            assert len(scored) == 3
            for logprobs, old, new in scored:
                assert logprobs[PUBLISH_AFTER:] == pytest.approx(new[PUBLISH_AFTER:], abs=1e-4)
                assert any(abs(a - b) > 1e-2 for a, b in zip(old[PUBLISH_AFTER:], new[PUBLISH_AFTER:], strict=True))


async def test_snapshot_clients_and_the_prefix_cache_across_publishes(
    tmp_path: Path,
    peaked_tiny_model: TinyModel,
) -> None:
    params = tinker_types.SamplingParams(max_tokens=4, seed=3, stop=[])
    async with training_client(tmp_path, peaked_tiny_model.path, deadline_s=120) as (_, trainer):
        tok = await trainer.get_tokenizer()
        prompt = tok.encode(TEXTS[0])
        model_input = tinker_types.ModelInput.from_ints(prompt)
        inflight = await trainer.save_weights_for_sampler("000000", inflight=True)
        pinned = await trainer.save_weights_for_sampler("pinned")
        pinned_before = await pinned.sample(model_input, 1, params)
        first = await inflight.sample(model_input, 1, params)
        again = await inflight.sample(model_input, 1, params)
        await _train_one_step(trainer, tok)
        await trainer.save_weights_for_sampler("000001", inflight=True)
        v1 = await trainer.create_sampling_client()
        fresh = await inflight.sample(model_input, 1, params)
        expected = await fresh_logprobs(v1, prompt, list(fresh.sequences[0].tokens))
        pinned_after = await pinned.sample(model_input, 1, params)
    assert first.prompt_cache_hit_tokens == 0 and again.prompt_cache_hit_tokens == len(prompt)
    assert token_versions(again.sequences[0]) == [0] * 4
    # The publish emptied the in-flight cache: the prompt is prefilled again, under the new weights.
    assert fresh.prompt_cache_hit_tokens == 0
    assert token_versions(fresh.sequences[0]) == [1] * 4
    assert list(fresh.sequences[0].logprobs or []) == pytest.approx(expected, abs=1e-4)
    # The pinned client neither moved nor lost its cache, and reports no versions.
    assert pinned_after.prompt_cache_hit_tokens == len(prompt)
    assert pinned_after.sequences[0].tokens == pinned_before.sequences[0].tokens
    assert token_versions(pinned_after.sequences[0]) is None


async def test_published_snapshots_release_the_adapters_they_replace(
    tmp_path: Path,
    peaked_tiny_model: TinyModel,
) -> None:
    async with training_client(tmp_path, peaked_tiny_model.path, deadline_s=120) as (_, trainer):
        inflight = await trainer.save_weights_for_sampler("000000", inflight=True)
        first = weakref.ref(inflight._engine._snapshot)
        for step in range(1, 5):
            await trainer.save_weights_for_sampler(f"{step:06d}", inflight=True)
        gc.collect()
        assert first() is None
        # One adapter samples, one was freed by the last publish for the next one to reuse.
        assert len(trainer.policy._pairs) == 2
        response = await inflight.sample(tinker_types.ModelInput.from_ints([1, 2, 3]), 1, SPAN)
    assert token_versions(response.sequences[0]) == [0] * 8
