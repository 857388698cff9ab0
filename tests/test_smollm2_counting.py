"""``examples/smollm2_counting.py`` without the model: its reward, its parsing, its problems' long tail."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import trio

from tests.conftest import load_example

END = 99


class DigitsTokenizer:
    """One token per character of ``0123456789, `` (ids 0-11) and an end-of-turn token (99)."""

    chars = "0123456789, "
    eos_token_id = END

    def encode(self, text: str) -> list[int]:
        return [self.chars.index(c) for c in text]

    def decode(self, tokens: list[int]) -> str:
        return "".join(self.chars[t] for t in tokens)

    def __init__(self) -> None:
        self.chats: list[list[dict[str, str]]] = []

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        self.chats.append(messages)
        return [1, 2, 3]


def test_the_reward_matches_positions_over_the_longer_list() -> None:
    counting = load_example("smollm2_counting")
    assert counting.reward([3, 4, 5, 6], 3, 6) == 1.0
    assert counting.reward([3, 4], 3, 6) == pytest.approx(2 / 4)
    assert counting.reward([3, 4, 5, 6, 7, 8], 3, 6) == pytest.approx(4 / 6)
    assert counting.reward([4, 5, 6, 7], 3, 6) == 0.0  # every position off by one
    assert counting.reward([], 3, 3) == 0.0


def test_an_answer_is_rewarded_only_when_it_ends_its_turn() -> None:
    counting = load_example("smollm2_counting")
    tokenizer = DigitsTokenizer()
    env = counting.CountingEnv(8, 11, counting.ChatRenderer(tokenizer))

    def step(text: str, end: bool) -> tuple[float, dict[str, float]]:
        result = trio.run(env.step, tokenizer.encode(text) + ([END] if end else []))
        return result.reward, result.metrics

    assert step("8, 9, 10, 11", True) == (1.0, {"exact": 1.0, "ended": 1.0})
    assert step("8, 9, 10, 11", False) == (0.0, {"exact": 0.0, "ended": 0.0})
    assert step("8, 9, 11", True)[0] == pytest.approx(2 / 4)


def test_few_shot_puts_the_worked_problems_before_the_problem_as_earlier_turns() -> None:
    counting = load_example("smollm2_counting")
    tokenizer = DigitsTokenizer()
    trio.run(counting.CountingEnv(8, 11, counting.ChatRenderer(tokenizer, counting.SHOTS)).initial_observation)
    trio.run(counting.CountingEnv(8, 11, counting.ChatRenderer(tokenizer)).initial_observation)
    ask = "Count from {} to {}, separated by commas. Answer with the numbers only."
    worked = [
        {"role": "user", "content": ask.format(3, 6)},
        {"role": "assistant", "content": "3, 4, 5, 6"},
        {"role": "user", "content": ask.format(11, 12)},
        {"role": "assistant", "content": "11, 12"},
    ]
    problem = {"role": "user", "content": ask.format(8, 11)}
    assert tokenizer.chats == [[*worked, problem], [problem]]
    assert counting.parse_args(counting.Args, []).few_shot is True


def test_spans_have_a_long_tail_proportional_to_one_over_span_plus_one() -> None:
    counting = load_example("smollm2_counting")
    rng = random.Random(0)
    spans = Counter(b - a for a, b in (counting.draw_problem(rng, 12) for _ in range(20000)))
    harmonic = sum(1 / (s + 1) for s in range(13))
    assert set(spans) == set(range(13))
    for span in (0, 3, 12):
        assert spans[span] / 20000 == pytest.approx(1 / (span + 1) / harmonic, rel=0.1), span
