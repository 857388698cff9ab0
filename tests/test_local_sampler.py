"""Batched sampling: reproducibility across batchings, stops, greedy, cancellation."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import trio
import trio.lowlevel
from tinker import types as tinker_types

from tests.local_helpers import CONFIG, TOK, bos_prompt, local_backend, local_training_client
from tests.polling import wait_until
from trio_rl import _tinker_compat as compat
from trio_rl.backends.local import EngineSettings, LocalBackend
from trio_rl.backends.local.sampler import LocalSamplingClient, pick_tokens


def _prompt(text: str) -> tinker_types.ModelInput:
    return tinker_types.ModelInput.from_ints(bos_prompt(text))


async def _sampler(backend: LocalBackend, seed: int = 0) -> LocalSamplingClient:
    client = await backend.create_training_client(base_model="tiny", seed=seed)
    return await client.save_weights_for_sampler(f"s{seed}")


def _seqs(resp: tinker_types.SampleResponse) -> list[tuple[list[int], list[float], str]]:
    return [(s.tokens, s.logprobs or [], s.stop_reason) for s in resp.sequences]


def test_pick_tokens_respects_top_k_top_p_and_greedy() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]] * 4, dtype=torch.float64))
    temp = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    top_k = torch.tensor([2, -1, -1, 1])
    top_p = torch.tensor([1.0, 0.6, 1.0, 1.0], dtype=torch.float64)
    for u in torch.linspace(0, 0.999, 50).tolist():
        tokens, lps = pick_tokens(logits, temp, top_k, top_p, torch.full((4,), u, dtype=torch.float64))
        assert tokens[0] in (0, 1)  # top_k=2
        assert tokens[1] in (0, 1)  # top_p=0.6 keeps 0.5 and 0.3
        assert tokens[2] == 0 and tokens[3] == 0  # greedy
        assert lps.tolist() == pytest.approx([math.log([0.5, 0.3, 0.15, 0.05][t]) for t in tokens.tolist()])
    # inverse-CDF: u just below 0.5/0.8 picks token 0, just above picks token 1
    tokens, _ = pick_tokens(logits[:1], temp[:1], top_k[:1], top_p[:1], torch.tensor([0.62], dtype=torch.float64))
    assert tokens.item() == 0
    tokens, _ = pick_tokens(logits[:1], temp[:1], top_k[:1], top_p[:1], torch.tensor([0.63], dtype=torch.float64))
    assert tokens.item() == 1


async def test_seeded_request_is_batch_invariant(tmp_path: Path) -> None:
    params = tinker_types.SamplingParams(max_tokens=24, seed=1234, stop=[])
    with trio.fail_after(30):
        async with local_backend(tmp_path) as backend:
            sampler = await _sampler(backend)
            alone = await sampler.sample(_prompt("abc"), 2, params)
            results: dict[int, tinker_types.SampleResponse] = {}

            async def one(i: int, text: str, p: tinker_types.SamplingParams) -> None:
                results[i] = await sampler.sample(_prompt(text), 1 + i % 3, p)

            async with trio.open_nursery() as nursery:
                others = [
                    "h",
                    "gfedcba abcdefgh",
                    "aa",
                    "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
                    "c d e",
                    "hgf",
                    "abcdefghabcdefgh ab",
                ]
                for i, text in enumerate(others):
                    nursery.start_soon(
                        one,
                        i + 1,
                        text,
                        tinker_types.SamplingParams(max_tokens=5 + 7 * i, seed=i, temperature=0.7 + 0.1 * i),
                    )
                nursery.start_soon(one, 0, "abc", params)  # same request, among 7 others
            # And once more while another request is already mid-decode (joins a running batch).
            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, 9, "hh", tinker_types.SamplingParams(max_tokens=40, seed=5, stop=[]))
                await trio.sleep(0.01)
                nursery.start_soon(one, 10, "abc", params)
    assert results[0].sequences[0].tokens  # sampled something
    assert len(results[0].sequences) == 1
    first = _seqs(alone)[0]
    assert _seqs(results[0])[0] == first
    assert _seqs(results[10])[0] == first
    # The two samples of one request differ (each has its own generator).
    assert _seqs(alone)[0][0] != _seqs(alone)[1][0]


async def test_logprobs_match_compute_logprobs(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with local_backend(tmp_path) as backend:
            sampler = await _sampler(backend)
            prompt = _prompt("abc")
            resp = await sampler.sample(prompt, 1, tinker_types.SamplingParams(max_tokens=10, seed=7, stop=[]))
            seq = resp.sequences[0]
            scored = await sampler.compute_logprobs(tinker_types.ModelInput.from_ints(prompt.to_ints() + seq.tokens))
    assert scored[0] is None
    assert scored[prompt.length :] == pytest.approx(seq.logprobs, abs=1e-6)


async def test_stops_max_tokens_and_greedy(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with local_backend(tmp_path) as backend:
            sampler = await _sampler(backend)
            greedy = tinker_types.SamplingParams(max_tokens=12, top_k=1, stop=[])
            g1 = await sampler.sample(_prompt("ab"), 3, greedy)
            g2 = await sampler.sample(
                _prompt("ab"), 1, tinker_types.SamplingParams(max_tokens=12, temperature=0.0, stop=[], seed=9)
            )
            toks = g1.sequences[0].tokens
            assert all(s.tokens == toks for s in g1.sequences) and g2.sequences[0].tokens == toks
            assert all(s.stop_reason == "length" and len(s.tokens) == 12 for s in g1.sequences)
            # Stop at a token that greedy decoding produces: output ends with it, reason "stop".
            target = toks[4]
            cut = toks.index(target) + 1
            by_id = await sampler.sample(
                _prompt("ab"), 1, tinker_types.SamplingParams(max_tokens=12, top_k=1, stop=[target])
            )
            assert by_id.sequences[0].tokens == toks[:cut] and by_id.sequences[0].stop_reason == "stop"
            # A multi-character string stop sequence.
            text = TOK.decode(toks[5:7])
            by_str = await sampler.sample(
                _prompt("ab"), 1, tinker_types.SamplingParams(max_tokens=12, top_k=1, stop=[text])
            )
            got = by_str.sequences[0].tokens
            assert TOK.decode(got).endswith(text) and by_str.sequences[0].stop_reason == "stop"
            assert got == toks[: len(got)] and len(got) <= 7
            # stop=None stops at EOS (forced by making EOS the only stop and checking the reason).
            none = await sampler.sample(_prompt("ab"), 4, tinker_types.SamplingParams(max_tokens=60, seed=3))
            for s in none.sequences:
                assert (s.stop_reason == "stop") == (s.tokens[-1] == TOK.eos_token_id)
                assert TOK.eos_token_id not in s.tokens[:-1]
            # max_tokens is capped by the model's context.
            long = await sampler.sample(
                _prompt("abc"), 1, tinker_types.SamplingParams(max_tokens=1000, stop=[], seed=1)
            )
            assert len(long.sequences[0].tokens) == CONFIG.max_seq_len - 4
            assert long.sequences[0].stop_reason == "length"
            zero = await sampler.sample(_prompt("a"), 2, tinker_types.SamplingParams(max_tokens=0))
            assert [s.tokens for s in zero.sequences] == [[], []]


async def test_bad_requests_raise(tmp_path: Path) -> None:
    async with local_backend(tmp_path) as backend:
        sampler = await _sampler(backend)
        with pytest.raises(ValueError):
            await sampler.sample(tinker_types.ModelInput.from_ints([]), 1, tinker_types.SamplingParams())
        with pytest.raises(ValueError):
            await sampler.sample(tinker_types.ModelInput.from_ints([999]), 1, tinker_types.SamplingParams())
        with pytest.raises(ValueError):
            await sampler.sample(_prompt("a"), 0, tinker_types.SamplingParams())


async def test_use_outside_async_with_raises(tmp_path: Path) -> None:
    backend = local_backend(tmp_path)
    with pytest.raises(RuntimeError, match="async with"):
        await backend.create_training_client(base_model="tiny")
    async with backend:
        sampler = await _sampler(backend)
    with pytest.raises(RuntimeError, match="async with"):
        await sampler.sample(_prompt("a"), 1, tinker_types.SamplingParams(max_tokens=3))
    with pytest.raises(RuntimeError, match="async with"):
        await sampler.compute_logprobs(_prompt("a"))


async def test_cancelled_request_is_dropped_and_nothing_leaks(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with local_backend(tmp_path) as backend:
            sampler = await _sampler(backend)
            engine = sampler._engine
            nursery = backend._runtime.nursery
            assert nursery is not None
            # Cancel while decoding: as soon as the engine holds the request's
            # rows, not after a wall-clock delay (a fast machine finishes the
            # whole max_seq_len-bounded decode within any fixed delay).
            decoding = trio.CancelScope()

            async def sample_until_cancelled() -> None:
                with decoding:
                    await sampler.sample(_prompt("a"), 4, tinker_types.SamplingParams(max_tokens=10**6, stop=[]))

            async with trio.open_nursery() as cancel_nursery:
                cancel_nursery.start_soon(sample_until_cancelled)
                while not engine._rows:
                    await trio.lowlevel.checkpoint()
                decoding.cancel()
            assert decoding.cancelled_caught
            # Cancel while still queued (never admitted).
            with trio.CancelScope() as scope2:
                scope2.cancel()
                await sampler.sample(_prompt("a"), 1, tinker_types.SamplingParams(max_tokens=5))
            # The backend still serves others.
            resp = await sampler.sample(_prompt("ab"), 2, tinker_types.SamplingParams(max_tokens=5, stop=[], seed=1))
            assert [len(s.tokens) for s in resp.sequences] == [5, 5]
            # The engine dropped the cancelled rows and its task ended.
            await wait_until(lambda: not nursery.child_tasks, poll=0.01)
            assert engine._rows == [] and engine._pending == [] and not engine._running


async def test_many_concurrent_requests(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with local_backend(tmp_path, engine=EngineSettings(max_batch_rows=16)) as backend:
            sampler = await _sampler(backend)
            lengths: list[int] = []

            async def one(i: int) -> None:
                r = await sampler.sample(
                    _prompt("abc"[: 1 + i % 3]), 2, tinker_types.SamplingParams(max_tokens=3 + i % 5, stop=[])
                )
                lengths.extend(len(s.tokens) for s in r.sequences)

            async with trio.open_nursery() as nursery:
                for i in range(40):
                    nursery.start_soon(one, i)
    assert sorted(lengths) == sorted(3 + i % 5 for i in range(40) for _ in range(2))


async def _group_rollouts(sampler: LocalSamplingClient) -> list[tinker_types.SampleResponse]:
    """A step's sampling: 3 prompts x 4 one-sample requests at once, then the same prompts again."""
    prompts = ["abc", "hg fe", "abc d"]
    out: dict[int, tinker_types.SampleResponse] = {}

    async def one(i: int) -> None:
        params = tinker_types.SamplingParams(max_tokens=10, seed=100 + i, stop=[])
        out[i] = await sampler.sample(_prompt(prompts[i % 3]), 1, params)

    for wave in range(2):
        async with trio.open_nursery() as nursery:
            for i in range(12 * wave, 12 * wave + 12):
                nursery.start_soon(one, i)
    return [out[i] for i in range(24)]


async def test_prefix_cache_gives_the_same_tokens_and_logprobs_as_no_cache(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with local_backend(tmp_path / "cached") as cached_backend:
            cached = await _group_rollouts(await _sampler(cached_backend))
        async with local_backend(tmp_path / "plain", engine=EngineSettings(prefix_cache_bytes=0)) as plain_backend:
            plain = await _group_rollouts(await _sampler(plain_backend))
    assert [_seqs(r) for r in cached] == [_seqs(r) for r in plain]
    lengths = [len(p) for p in ("abc", "hg fe", "abc d")]
    # Each prompt is prefilled once: the request that arrived first pays, every other one is a hit.
    hits = [r.prompt_cache_hit_tokens for r in cached]
    for k in range(3):
        assert sorted(hits[k::3]) == [0] + [lengths[k] + 1] * 7
    # Without a kept cache only the requests of one batch share a prefill: the second wave prefills again.
    assert sorted(r.prompt_cache_hit_tokens for r in plain[12::3]) == [0, 4, 4, 4]


async def test_prefix_cache_is_not_shared_across_weights(tmp_path: Path) -> None:
    params = tinker_types.SamplingParams(max_tokens=10, seed=5, stop=[])
    async with local_training_client(tmp_path) as (_, client):
        old = await client.save_weights_for_sampler("old")
        first = await old.sample(_prompt("abc"), 1, params)
        assert (await old.sample(_prompt("abc"), 1, params)).prompt_cache_hit_tokens == 4
        datum = tinker_types.Datum(
            model_input=_prompt("abcab"),
            loss_fn_inputs={
                "target_tokens": compat.tensor(TOK.encode("abcabc"), "int64"),
                "weights": compat.tensor([1.0] * 6, "float32"),
            },
        )
        await (await client.forward_backward([datum], "cross_entropy")).result()
        await (await client.optim_step(tinker_types.AdamParams(learning_rate=0.05))).result()
        new = await client.save_weights_for_sampler("new")
        after = await new.sample(_prompt("abc"), 1, params)
        # The new weights prefill the prompt afresh, and sample from the new weights.
        assert after.prompt_cache_hit_tokens == 0
        assert after.sequences[0].logprobs != first.sequences[0].logprobs
        assert _seqs(await old.sample(_prompt("abc"), 1, params)) == _seqs(first)
