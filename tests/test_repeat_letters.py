"""``examples/repeat_letters.py``: its reward, its long-tailed counts, its evaluator, and a short run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio
from tinker import types as tinker_types

from tests.conftest import load_example, read_jsonl
from trio_rl.backends.local import CharTokenizer
from trio_rl.cli import LazyTokenizer, parse_args


def test_the_reward_counts_right_letters_over_the_longer_of_count_and_answer() -> None:
    repeat = load_example("repeat_letters")
    tokenizer = CharTokenizer(repeat.ALPHABET)
    env = repeat.RepeatEnv("b", 7, repeat.Renderer(LazyTokenizer(tokenizer)))

    def reward(tokens: list[int]) -> float:
        return float(trio.run(env.step, tokens).reward)

    eos = [tokenizer.eos_token_id]
    assert reward(tokenizer.encode("bbbbbbb") + eos) == 1.0
    assert reward(tokenizer.encode("bbbbbbb")) == 1.0  # cut at max_tokens, but right
    assert reward(tokenizer.encode("bbb") + eos) == pytest.approx(3 / 7)  # too short
    assert reward(tokenizer.encode("bbbbbbbbb") + eos) == pytest.approx(7 / 9)  # too long
    assert reward(tokenizer.encode("bbbabbb") + eos) == pytest.approx(6 / 7)
    assert reward(tokenizer.encode("aaaaaaa") + eos) == 0.0
    assert reward(eos) == 0.0
    # A special token in the body is never a right letter, and counts towards the length.
    assert reward([*tokenizer.encode("bbb"), tokenizer.bos_token_id, *tokenizer.encode("bbb")]) == pytest.approx(6 / 7)
    observation, stop = trio.run(env.initial_observation)
    assert observation.to_ints() == [tokenizer.bos_token_id, *tokenizer.encode("7b=")] and stop == eos


def test_counts_have_a_long_tail_proportional_to_one_over_n() -> None:
    repeat = load_example("repeat_letters")
    tokenizer = LazyTokenizer(CharTokenizer(repeat.ALPHABET))
    args = parse_args(repeat.Args, [], groups_per_batch=64, group_size=1)
    dataset = repeat.RepeatDataset(args, repeat.Renderer(tokenizer), num_batches=200)
    counts = Counter(b.count for i in range(len(dataset)) for b in dataset.get_batch(i))
    total = sum(counts.values())
    harmonic = sum(1 / n for n in range(1, 17))
    assert set(counts) == set(range(1, 17))
    for n in (1, 2, 8, 16):
        assert counts[n] / total == pytest.approx(1 / n / harmonic, rel=0.15), n
    assert sum(counts[n] for n in range(1, 4)) / total > 0.5
    # Batch i depends only on the seed and i.
    assert [(b.letter, b.count) for b in dataset.get_batch(3)] == [(b.letter, b.count) for b in dataset.get_batch(3)]


def test_a_count_beyond_two_digits_is_refused() -> None:
    repeat = load_example("repeat_letters")
    args = parse_args(repeat.Args, [], max_count=100)
    with pytest.raises(ValueError, match=r"--max-count must be in 1\.\.99"):
        repeat.RepeatDataset(args, repeat.Renderer(LazyTokenizer(CharTokenizer(repeat.ALPHABET))), 1)


class AnswersRight:
    """A sampling client that answers every prompt ``<bos>{n}{letter}=`` exactly, except count 1."""

    def __init__(self, tokenizer: CharTokenizer) -> None:
        self.tokenizer = tokenizer

    async def sample(self, prompt: tinker_types.ModelInput, n: int, params: tinker_types.SamplingParams) -> object:
        text = self.tokenizer.decode(prompt.to_ints()[1:])
        count, letter = int(text[:-2]), text[-2]
        answer = letter * (count if count > 1 else 3)
        tokens = [*self.tokenizer.encode(answer), self.tokenizer.eos_token_id]
        return SimpleNamespace(sequences=[SimpleNamespace(tokens=tokens)])


def test_the_evaluator_scores_every_letter_and_count_greedily() -> None:
    repeat = load_example("repeat_letters")
    tokenizer = CharTokenizer(repeat.ALPHABET)
    evaluator = repeat.ExactEvaluator(repeat.Renderer(LazyTokenizer(tokenizer)), 4, 8)
    result = trio.run(evaluator, AnswersRight(tokenizer))
    # 8 prompts (2 letters x counts 1..4); count 1 answered with 3 letters: reward 1/3.
    assert result == {"eval/exact": 6 / 8, "eval/reward": pytest.approx((6 + 2 / 3) / 8)}


def test_the_example_runs_async_with_the_default_loss(tmp_path: Path) -> None:
    repeat = load_example("repeat_letters")
    argv = ["--log-path", str(tmp_path), "--max-steps", "3", "--groups-per-batch", "4", "--group-size", "2"]
    argv += ["--eval-every", "2", "--mode", "async", "--max-tokens", "8"]
    assert repeat.main(argv, d_model=16, n_layers=1, n_heads=2, progress=False) == 0
    records = read_jsonl(tmp_path / "metrics.jsonl")
    steps = [r for r in records if "progress/groups" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert all(0.0 <= r["env/all/reward/total"] <= 1.0 for r in steps)
    assert any("eval/exact" in r for r in records)
    # No --loss-fn: LocalBackend's async default, token TIS, not the sync loss.
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["async_config"]["loss_fn"], saved["loss_fn_config"]) == ("importance_sampling", {"tis_cap": 2.0})
    # The corrected loss's statistics (a step whose groups all had one reward trains nothing and logs none).
    assert any(r.get("offpolicy/tokens", 0) > 0 for r in steps)
