"""The prefix cache: prompts that share a prefix prefill it once (the radix tree, and LocalBackend's engine)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import torch
import trio
from tinker import types as tinker_types

from tests.inflight_helpers import train_one_large_step
from tests.local_helpers import TOK, bos_prompt, local_backend, local_training_client
from tests.prefill_helpers import count_prefilled_tokens, sample_each
from trio_rl import Config, train
from trio_rl.backends.local import EngineSettings, LocalBackend, ModelConfig
from trio_rl.backends.local.prefix_cache import Prefill, PrefixCache
from trio_rl.backends.local.sampler import LocalSamplingClient
from trio_rl.testing import FakeDataset, FakeEnvSpec

PARAMS = tinker_types.SamplingParams(max_tokens=6, seed=3, stop=[])


# ------------------------------------------------------------------ the tree alone


def _prefill(tokens: tuple[int, ...]) -> Prefill:
    """A prefill whose keys are its tokens (values ten times them), so a lookup's tensors say which tokens they hold."""
    keys = torch.tensor(tokens, dtype=torch.float64).view(1, 1, -1, 1).expand(1, 2, -1, 4).clone()
    return Prefill(
        [(keys, 10 * keys), (keys + 0.5, 10 * keys + 0.5)], torch.full((8,), float(sum(tokens)), dtype=torch.float64)
    )


def _tokens_of(kv: list[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    """The tokens a lookup's keys and values were computed for (checking every layer agrees)."""
    if not kv:
        return []
    keys = kv[0][0][0, 0, :, 0]
    assert torch.equal(kv[0][1][0, 0, :, 0], 10 * keys) and torch.equal(kv[1][0][0, 0, :, 0], keys + 0.5)
    return [int(t) for t in keys.tolist()]


def _token_bytes(n: int) -> int:
    """Keys and values of ``n`` tokens in :func:`_prefill`'s layout (2 layers, 2 heads, dim 4, float64)."""
    return n * 2 * 2 * (2 * 4 * 8)


LOGITS_BYTES = 8 * 8


def test_a_prompt_gets_the_longest_prefix_any_kept_prompt_shares_with_it() -> None:
    cache = PrefixCache()
    a, b = (1, 2, 3, 4, 5), (1, 2, 7, 8)
    cache.put(a, _prefill(a))
    cache.put(b, _prefill(b))
    longer = cache.lookup((1, 2, 3, 4, 9, 9))
    assert (longer.length, longer.logits) == (4, None) and _tokens_of(longer.kv) == [1, 2, 3, 4]
    turn_two = cache.lookup((*b, 5, 6))
    assert turn_two.length == 4 and _tokens_of(turn_two.kv) == list(b)
    whole = cache.lookup(a)
    assert whole.length == 5 and _tokens_of(whole.kv) == list(a)
    assert whole.logits is not None and torch.equal(whole.logits, _prefill(a).logits)
    # A kept prompt's strict prefix: its last token's logits must come from a forward pass.
    inside = cache.lookup((1, 2, 3))
    assert (inside.length, inside.logits) == (2, None) and _tokens_of(inside.kv) == [1, 2]
    assert cache.lookup((6, 1)).length == 0 and cache.lookup((6, 1)).kv == []
    assert cache.lookup((1,)).length == 0  # never all of a prompt without its logits


def test_prompts_sharing_a_prefix_store_its_keys_and_values_once() -> None:
    cache = PrefixCache()
    turn_one = (1, 2, 3, 4, 5)
    cache.put(turn_one, _prefill(turn_one))
    assert cache.nbytes == _token_bytes(5) + LOGITS_BYTES
    sibling = (1, 2, 7, 8)  # another env's prompt with the same first two tokens
    cache.put(sibling, _prefill(sibling))
    assert cache.nbytes == _token_bytes(5 + 2) + 2 * LOGITS_BYTES
    turn_two = (*turn_one, 6, 7, 8)
    cache.put(turn_two, _prefill(turn_two))
    assert cache.nbytes == _token_bytes(5 + 2 + 3) + 3 * LOGITS_BYTES
    # A strict prefix of a kept prompt adds its logits, not its keys and values again.
    cache.put((1, 2, 3), _prefill((1, 2, 3)))
    assert cache.nbytes == _token_bytes(10) + 4 * LOGITS_BYTES and len(cache) == 4
    for prompt in (turn_one, sibling, turn_two, (1, 2, 3)):
        found = cache.lookup(prompt)
        assert found.length == len(prompt) and _tokens_of(found.kv) == list(prompt)
        assert found.logits is not None and float(found.logits[0]) == sum(prompt)


def test_eviction_drops_least_recently_used_leaves_and_keeps_the_bytes_within_the_bound() -> None:
    a, b, c = (1, 2, 3, 4), (1, 2, 5, 6), (7, 8, 9, 10)
    cache = PrefixCache(max_bytes=_token_bytes(9) + 3 * LOGITS_BYTES)
    cache.put(a, _prefill(a))
    cache.put(b, _prefill(b))  # the tree: (1 2) -> (3 4), (5 6)
    assert cache.lookup(a).logits is not None  # b's leaf is now the least recently used
    cache.put(c, _prefill(c))
    assert cache.nbytes == _token_bytes(8) + 2 * LOGITS_BYTES
    # b's own tokens went first; the prefix it shared with a stays, as a's.
    assert cache.lookup(b).length == 2
    assert cache.lookup(a).logits is not None and cache.lookup(c).logits is not None
    cache.put((11, 12, 13, 14, 15), _prefill((11, 12, 13, 14, 15)))
    # Pressure again: the least recently used leaf (a's (3 4)) and then its parent, now a leaf, go.
    assert cache.lookup(a).length == 0 and cache.lookup(c).logits is not None
    assert cache.nbytes == _token_bytes(9) + 2 * LOGITS_BYTES
    huge = tuple(range(20, 40))
    cache.put(huge, _prefill(huge))  # bigger than the bound alone: nothing is kept
    assert cache.nbytes == 0 and len(cache) == 0 and cache.lookup(c).length == 0
    cache.put(a, _prefill(a))
    cache.clear()
    assert cache.nbytes == 0 and cache.lookup(a).length == 0
    assert PrefixCache(max_bytes=0).lookup(a).length == 0


# ------------------------------------------------------------------ LocalBackend's engine


def _seqs(resp: tinker_types.SampleResponse) -> list[tuple[list[int], list[float], str]]:
    return [(list(s.tokens), list(s.logprobs or []), s.stop_reason) for s in resp.sequences]


async def _sample(sampler: LocalSamplingClient, prompt: list[int], seed: int = 3) -> tinker_types.SampleResponse:
    params = tinker_types.SamplingParams(max_tokens=6, seed=seed, stop=[])
    return await sampler.sample(tinker_types.ModelInput.from_ints(prompt), 1, params)


async def test_a_turn_two_prompt_prefills_only_the_tokens_after_the_turn_one_prompt(tmp_path: Path) -> None:
    turn_one = bos_prompt("abc abc")
    async with local_training_client(tmp_path) as (_, client):
        sampler = await client.save_weights_for_sampler("s0")
        passes = count_prefilled_tokens(sampler)
        first = await _sample(sampler, turn_one)
        turn_two = [*turn_one, *first.sequences[0].tokens, *TOK.encode(" dd")]
        second = await _sample(sampler, turn_two)
        # A strict prefix of a kept prompt: all but its last token are cached ...
        inside = await _sample(sampler, turn_one[:4])
        # ... and once kept whole, the same prompt needs no forward pass at all.
        again = await _sample(sampler, turn_one[:4])
    assert first.prompt_cache_hit_tokens == 0
    assert second.prompt_cache_hit_tokens == len(turn_one)
    assert inside.prompt_cache_hit_tokens == 3 and again.prompt_cache_hit_tokens == 4
    assert passes == [[len(turn_one)], [len(turn_two) - len(turn_one)], [1]]
    assert _seqs(again) == _seqs(inside)


async def _conversations(sampler: LocalSamplingClient) -> list[tinker_types.SampleResponse]:
    """A group of 4 two-turn envs sharing a system prompt, waves of concurrent requests; every response in order."""
    system = "ab ab "
    out: list[tinker_types.SampleResponse] = []

    async def wave(prompts: list[list[int]], seed: int) -> list[tinker_types.SampleResponse]:
        responses = await sample_each(partial(_sample, sampler), prompts, seed)
        out.extend(responses)
        return responses

    turn_one = [bos_prompt(system + q) for q in ("c", "d", "c", "eh")]
    answers = await wave(turn_one, 10)
    turn_two = [
        [*p, *a.sequences[0].tokens, *TOK.encode(" " + "gh"[i % 2] * (1 + i // 2))]
        for i, (p, a) in enumerate(zip(turn_one, answers, strict=True))
    ]
    await wave(turn_two, 20)
    # A strict prefix of kept prompts, the system prompt alone, and the whole second turn again.
    await wave([bos_prompt(system), bos_prompt(system[:3])], 30)
    await wave(turn_two, 20)
    return out


async def test_shared_prefixes_give_the_same_tokens_and_logprobs_as_no_cache(tmp_path: Path) -> None:
    with trio.fail_after(120):
        async with local_backend(tmp_path / "cached") as backend:
            client = await backend.create_training_client(base_model="tiny", seed=0)
            cached = await _conversations(await client.save_weights_for_sampler("s0"))
        async with local_backend(tmp_path / "plain", engine=EngineSettings(prefix_cache_bytes=0)) as backend:
            client = await backend.create_training_client(base_model="tiny", seed=0)
            plain = await _conversations(await client.save_weights_for_sampler("s0"))
        # A bound that holds about one prompt: prefixes are evicted and computed again.
        async with local_backend(tmp_path / "tight", engine=EngineSettings(prefix_cache_bytes=12 << 10)) as backend:
            client = await backend.create_training_client(base_model="tiny", seed=0)
            tight = await _conversations(await client.save_weights_for_sampler("s0"))
    # Float64 forward passes, rounded to float32: bit for bit.
    assert [_seqs(r) for r in cached] == [_seqs(r) for r in plain] == [_seqs(r) for r in tight]
    hits = [r.prompt_cache_hit_tokens for r in cached]
    system = len(bos_prompt("ab ab "))
    # Turn one: one admission batch; only env 0's and env 2's identical prompts share.
    assert sorted(hits[0:3:2]) == [0, system + 1] and hits[1] == hits[3] == 0
    # Turn two: each env's turn-one prompt is cached.
    assert hits[4:8] == [system + 1, system + 1, system + 1, system + 2]
    # The system prompt, a strict prefix of kept prompts: all but its last token; its own prefix likewise.
    assert hits[8:10] == [system - 1, 3]
    # The second turn again: whole prompts (turn one's, 6 answer tokens, 2 or 3 more), with their logits.
    assert hits[10:] == [system + 1 + 8, system + 1 + 8, system + 1 + 9, system + 2 + 9]
    assert [r.prompt_cache_hit_tokens for r in plain][4:8] == [0, 0, 0, 0]
    assert sum(r.prompt_cache_hit_tokens for r in tight) < sum(hits)


async def test_a_publish_empties_the_cache_of_an_inflight_engine_prefixes_included(tmp_path: Path) -> None:
    turn_one = bos_prompt("abc abc")
    async with local_training_client(tmp_path) as (_, client):
        inflight = await client.save_weights_for_sampler("000000", inflight=True)
        first = await _sample(inflight, turn_one)
        turn_two = [*turn_one, *first.sequences[0].tokens, *TOK.encode(" dd")]
        before = await _sample(inflight, turn_two)
        await train_one_large_step(client, bos_prompt("abcab"), TOK.encode("abcabc"))
        await client.save_weights_for_sampler("000001", inflight=True)
        fresh = await client.create_sampling_client()
        after = await _sample(inflight, [*turn_two, *TOK.encode("e")])
        expected = await _sample(fresh, [*turn_two, *TOK.encode("e")])
    assert before.prompt_cache_hit_tokens == len(turn_one)
    # Neither the turn-one nor the turn-two prompt, prefilled under the old weights, serves the new ones.
    assert after.prompt_cache_hit_tokens == 0
    assert after.sequences[0].tokens == expected.sequences[0].tokens
    assert list(after.sequences[0].logprobs or []) == list(expected.sequences[0].logprobs or [])


def test_a_two_turn_env_reports_its_turn_one_prompt_as_prefill_cached(tmp_path: Path) -> None:
    # FakeEnv's prompts differ per env in their third token, so only the growing prompt can share.
    spec = FakeEnvSpec(group_size=2, turns=2)
    dataset = FakeDataset(2, 2, spec)
    config = Config(log_path=tmp_path, max_tokens=3, eval_every=0, save_every=0, seed=0)

    async def main() -> Any:
        model = ModelConfig(d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
        async with LocalBackend(log_dir=tmp_path, model_config=model, seed=0) as backend:
            return await train(config, dataset=dataset, backend=backend)

    result = trio.run(main)
    for record in result.step_metrics:
        cached, uncached = record["tokens/prefill_cached"], record["tokens/prefill_uncached"]
        # 4 envs, each with a 3-token turn-one prompt served from the cache in turn two.
        assert cached >= 4 * 3, record
        assert cached + uncached == record["env/all/total_ob_tokens"], record
