"""LocalBackend's in-flight weights: versions per token, logprobs per version, KV kept or recomputed, prefix cache, memory."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Any

import pytest
import trio
from tinker import types as tinker_types

from tests.inflight_helpers import fresh_logprobs, publish_after_step, span_a_publish, train_one_large_step
from tests.local_helpers import TOK, bos_prompt, local_backend, local_training_client
from trio_rl.backends.local import EngineSettings, LocalBackend
from trio_rl.backends.local.sampler import LocalSamplingClient, SamplingEngine
from trio_rl.backends.protocol import check_inflight_before_work, token_versions

SPAN = tinker_types.SamplingParams(max_tokens=12, seed=7, stop=[])
PUBLISH_AFTER = 5  # decode steps; step 1 prefills and picks the first token


async def _train_one_step(client: Any) -> None:
    """One large Adam step, so the next weights sample visibly differently."""
    await train_one_large_step(client, bos_prompt("abcab"), TOK.encode("abcabc"))


async def _span_a_publish(
    backend: LocalBackend, prompts: list[tuple[str, int]]
) -> tuple[list[tinker_types.SampleResponse], LocalSamplingClient, LocalSamplingClient]:
    """Sample ``prompts`` (text, samples) on a v0 in-flight client while v1 is published after PUBLISH_AFTER steps.

    Returns:
        The responses, and pinned snapshots of v0 and v1.
    """
    client = await backend.create_training_client(base_model="tiny", seed=0)
    return await span_a_publish(
        backend,
        client,
        [(bos_prompt(text), samples) for text, samples in prompts],
        train_one_step=lambda: _train_one_step(client),
        params=SPAN,
        after_step=PUBLISH_AFTER,
    )


def test_local_backend_offers_inflight_weights(tmp_path: Path) -> None:
    backend = local_backend(tmp_path)
    backend.check_inflight_weights()
    check_inflight_before_work(backend)


async def test_a_sequence_spanning_a_publish_carries_both_versions_and_keeps_its_kv(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with local_backend(tmp_path) as backend:
            (response,), v0, v1 = await _span_a_publish(backend, [("abc", 1)])
            seq = response.sequences[0]
            assert token_versions(seq) == [0] * PUBLISH_AFTER + [1] * (12 - PUBLISH_AFTER)
            logprobs = list(seq.logprobs or [])
            old = await fresh_logprobs(v0, bos_prompt("abc"), list(seq.tokens))
            new = await fresh_logprobs(v1, bos_prompt("abc"), list(seq.tokens))
    # Tokens before the publish are exactly the old weights'.
    assert logprobs[:PUBLISH_AFTER] == pytest.approx(old[:PUBLISH_AFTER], abs=1e-5)
    # After it, the new weights read keys and values the old weights computed:
    # neither the old weights' fresh pass nor the new weights' one.
    after = range(PUBLISH_AFTER, 12)
    assert any(abs(logprobs[i] - old[i]) > 1e-3 for i in after)
    assert any(abs(logprobs[i] - new[i]) > 1e-3 for i in after)


async def test_with_kv_recomputation_each_logprob_is_a_fresh_pass_of_the_weights_that_produced_it(
    tmp_path: Path,
) -> None:
    with trio.fail_after(60):
        async with local_backend(tmp_path, engine=EngineSettings(inflight_recompute_kv=True)) as backend:
            # Rows of different prompt lengths, several per request, recomputed together.
            responses, v0, v1 = await _span_a_publish(backend, [("abc", 2), ("hgfedcba ab", 1)])
            checked = 0
            for text, response in zip(["abc", "hgfedcba ab"], responses, strict=True):
                for seq in response.sequences:
                    tokens, logprobs = list(seq.tokens), list(seq.logprobs or [])
                    assert token_versions(seq) == [0] * PUBLISH_AFTER + [1] * (12 - PUBLISH_AFTER)
                    old = await fresh_logprobs(v0, bos_prompt(text), tokens)
                    new = await fresh_logprobs(v1, bos_prompt(text), tokens)
                    assert logprobs[:PUBLISH_AFTER] == pytest.approx(old[:PUBLISH_AFTER], abs=1e-5)
                    assert logprobs[PUBLISH_AFTER:] == pytest.approx(new[PUBLISH_AFTER:], abs=1e-5)
                    assert any(abs(a - b) > 1e-3 for a, b in zip(old[PUBLISH_AFTER:], new[PUBLISH_AFTER:], strict=True))
                    checked += 1
    assert checked == 3


async def test_snapshot_clients_are_unaffected_by_inflight_publishes(tmp_path: Path) -> None:
    prompt = tinker_types.ModelInput.from_ints(bos_prompt("abc"))
    async with local_training_client(tmp_path) as (backend, client):
        inflight = await client.save_weights_for_sampler("000000", inflight=True)
        pinned = await client.save_weights_for_sampler("pinned")
        before = await pinned.sample(prompt, 2, SPAN)
        await _train_one_step(client)
        async with trio.open_nursery() as nursery:
            publish_after_step(
                inflight._engine,
                3,
                lambda: client.save_weights_for_sampler("000001", inflight=True),
                backend._runtime.limiter,
                nursery,
            )
            nursery.start_soon(inflight.sample, prompt, 1, SPAN)
            during = await pinned.sample(prompt, 2, SPAN)
        after = await pinned.sample(prompt, 2, SPAN)
    for response in (before, during, after):
        assert all(token_versions(seq) is None for seq in response.sequences)
    assert (
        [s.tokens for s in during.sequences]
        == [s.tokens for s in before.sequences]
        == [s.tokens for s in after.sequences]
    )
    assert [s.logprobs for s in during.sequences] == [s.logprobs for s in before.sequences]


async def test_a_new_request_on_an_older_inflight_client_starts_on_the_newest_weights(tmp_path: Path) -> None:
    prompt = bos_prompt("abc")
    async with local_training_client(tmp_path) as (_, client):
        first = await client.save_weights_for_sampler("000000", inflight=True)
        await _train_one_step(client)
        second = await client.save_weights_for_sampler("000001", inflight=True)
        v1 = await client.create_sampling_client()
        response = await first.sample(tinker_types.ModelInput.from_ints(prompt), 1, SPAN)
        seq = response.sequences[0]
        fresh = await fresh_logprobs(v1, prompt, list(seq.tokens))
        scored = await first.compute_logprobs(tinker_types.ModelInput.from_ints([*prompt, *seq.tokens]))
        assert second.model_path is not None and second.model_path.endswith("000001")
    assert token_versions(seq) == [1] * 12
    assert list(seq.logprobs or []) == pytest.approx(fresh, abs=1e-5)
    assert [v for v in scored[len(prompt) :]] == pytest.approx(fresh, abs=1e-5)


async def test_the_prefix_cache_serves_a_prompt_only_under_the_weights_that_prefilled_it(tmp_path: Path) -> None:
    prompt = bos_prompt("abc")
    params = tinker_types.SamplingParams(max_tokens=1, seed=3, stop=[])
    model_input = tinker_types.ModelInput.from_ints(prompt)
    async with local_training_client(tmp_path) as (_, client):
        inflight = await client.save_weights_for_sampler("000000", inflight=True)
        assert (await inflight.sample(model_input, 1, params)).prompt_cache_hit_tokens == 0
        again = await inflight.sample(model_input, 1, params)
        await _train_one_step(client)
        await client.save_weights_for_sampler("000001", inflight=True)
        v1 = await client.create_sampling_client()
        fresh = await inflight.sample(model_input, 1, params)
        cached = await inflight.sample(model_input, 1, params)
        expected = await fresh_logprobs(v1, prompt, list(fresh.sequences[0].tokens))
    assert again.prompt_cache_hit_tokens == len(prompt)
    # The publish emptied the cache: the prompt is prefilled again under the new weights ...
    assert fresh.prompt_cache_hit_tokens == 0
    assert token_versions(fresh.sequences[0]) == [1]
    assert list(fresh.sequences[0].logprobs or []) == pytest.approx(expected, abs=1e-5)
    # ... and then served from the cache again, within that version.
    assert cached.prompt_cache_hit_tokens == len(prompt)
    assert list(cached.sequences[0].logprobs or []) == list(fresh.sequences[0].logprobs or [])


async def test_published_weights_release_the_ones_they_replace(tmp_path: Path) -> None:
    async with local_training_client(tmp_path) as (_, client):
        inflight = await client.save_weights_for_sampler("000000", inflight=True)
        engine = inflight._engine
        assert isinstance(engine, SamplingEngine)
        v0 = weakref.ref(engine._model)
        await _train_one_step(client)
        await client.save_weights_for_sampler("000001", inflight=True)
        v1 = weakref.ref(engine._model)
        await client.save_weights_for_sampler("000002", inflight=True)
        gc.collect()
        assert v0() is None and v1() is None
        assert engine._model is not None and engine.version == 1
        # The latest weights still sample, and say so.
        response = await inflight.sample(tinker_types.ModelInput.from_ints(bos_prompt("ab")), 1, SPAN)
    assert token_versions(response.sequences[0]) == [1] * 12
