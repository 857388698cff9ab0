"""Learn to write a letter a given number of times with RL: the prompt is ``7b=``, the answer ``bbbbbbb``.

    python examples/repeat_letters.py                 # async RL on LocalBackend
    python examples/repeat_letters.py --mode sync     # on-policy

A task whose answers are many tokens long, of lengths that differ widely from
prompt to prompt, with a long tail: the count ``n`` is drawn with probability
proportional to ``1 / n`` from 1 to ``--max-count`` (16 by default: half the
prompts ask for at most 3 letters, one in twelve for 13 or more), and a random
policy's answers run on to ``max_tokens`` until it learns to stop. So a step's
slowest rollout is many times its median, and tokens are sampled while the
weights move: the case where staleness and off-policy corrections matter.

The policy is a tiny transformer with random weights over ``0123456789ab=``
(LocalBackend). The reward gives partial credit: the number of right letters
in the first ``n`` positions, divided by the longer of ``n`` and the answer's
length, so a wrong letter, a short answer and a long one all cost. Every
``--eval-every`` steps an evaluator answers every count and letter greedily
and logs ``eval/exact`` (the fraction exactly right) and ``eval/reward``.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

if __name__ == "__main__":
    # Ctrl-C (or SIGTERM) while the imports below load (torch takes seconds) ends the
    # process at once with 130 (143): nothing has started, and an exception raised
    # here can land in the import machinery, which ignores it and may then hang.
    # Once the run starts, trio_rl.cli handles both signals.
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(143))

from tinker import types as tinker_types

from trio_rl import (
    Config,
    Env,
    EnvGroupBuilder,
    Metrics,
    Observation,
    RLDataset,
    SamplingClient,
    StepResult,
    StopCondition,
    Trajectory,
    derive_seed,
)
from trio_rl.cli import CommonArgs, Experiment, LazyTokenizer, run_example

LETTERS = "ab"
ALPHABET = "0123456789" + LETTERS + "="
"""The LocalBackend tokenizer's characters."""


# ---------------------------------------------------------------- configuration

CONFIG = Config(
    log_path="runs/repeat_letters",
    learning_rate=1e-3,  # a tiny model trained from scratch: ten times Config's fine-tuning rate
    max_tokens=24,  # room past the longest count, so too long an answer is possible
    max_steps=200,
    eval_every=10,
    save_every=50,
    save_on_cancel=True,
)
"""Where this example departs from Config's defaults; every plain Config field is also a flag (``--learning-rate``)."""


@dataclass
class Args(CommonArgs):
    """Flags of this example; every field is a ``--flag`` (underscores become dashes)."""

    config: Config = CONFIG
    groups_per_batch: int = 8
    """prompts per training step"""
    group_size: int = 8
    """answers sampled per prompt"""
    max_count: int = 16
    """counts are drawn from 1 to this, with probability proportional to 1 / count"""


# ---------------------------------------------------------------- the environment


def reward(answer: str, letter: str, count: int) -> float:
    """Right letters among the first ``count`` characters, over the longer of ``count`` and the answer."""
    right = sum(1 for char in answer[:count] if char == letter)
    return right / max(count, len(answer))


class Renderer:
    """The prompt ``<bos>7b=`` ending at end-of-sequence (LocalBackend), or a line of text (a real tokenizer)."""

    def __init__(self, tokenizer: LazyTokenizer) -> None:
        self.tokenizer = tokenizer

    def _char_tokenizer(self) -> Any:
        real = self.tokenizer.get()
        return real if getattr(real, "alphabet", None) is not None else None

    def prompt(self, letter: str, count: int) -> tuple[Observation, StopCondition]:
        chars = self._char_tokenizer()
        if chars is not None:
            tokens = [chars.bos_token_id, *chars.encode(f"{count}{letter}=")]
            return tinker_types.ModelInput.from_ints(tokens), [chars.eos_token_id]
        text = f"Write the letter {letter} {count} times, nothing else.\n"
        return tinker_types.ModelInput.from_ints(self.tokenizer.encode(text)), ["\n"]

    def parse(self, action: Sequence[int]) -> str:
        """The answer's text, without the end-of-sequence token; a special token reads as ``?`` (never right)."""
        chars = self._char_tokenizer()
        if chars is not None:
            body = list(action[:-1]) if action and action[-1] == chars.eos_token_id else list(action)
            return "".join(chars.decode([t]) or "?" for t in body)
        return self.tokenizer.decode(action).strip()


class RepeatEnv(Env):
    """One prompt, one turn, rewarded by :func:`reward`."""

    def __init__(self, letter: str, count: int, renderer: Renderer) -> None:
        self.letter, self.count = letter, count
        self.renderer = renderer

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return self.renderer.prompt(self.letter, self.count)

    async def step(self, action: list[int]) -> StepResult:
        answer = self.renderer.parse(action)
        score = reward(answer, self.letter, self.count)
        return StepResult(
            reward=score,
            episode_done=True,
            next_observation=tinker_types.ModelInput.from_ints([]),
            next_stop_condition=[],
            metrics={"exact": float(answer == self.letter * self.count), "answer_length": float(len(answer))},
        )


@dataclass
class RepeatGroupBuilder(EnvGroupBuilder):
    """``group_size`` copies of one prompt; their rewards are centred together."""

    letter: str
    count: int
    group_size: int
    renderer: Renderer

    async def make_envs(self) -> Sequence[Env]:
        return [RepeatEnv(self.letter, self.count, self.renderer) for _ in range(self.group_size)]

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return ["short" if self.count <= 4 else "long"]


def count_weights(max_count: int) -> list[float]:
    """``P(count = n)`` proportional to ``1 / n`` for ``n`` in ``1..max_count``."""
    return [1.0 / n for n in range(1, max_count + 1)]


class RepeatDataset(RLDataset):
    """``num_batches`` batches of prompts; batch ``i`` depends only on (seed, i)."""

    def __init__(self, args: Args, renderer: Renderer, num_batches: int) -> None:
        if not 1 <= args.max_count <= 99:
            raise ValueError(f"--max-count must be in 1..99 (a two-digit count), got {args.max_count}")
        self.args = args
        self.renderer = renderer
        self.num_batches = num_batches

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        rng = random.Random(derive_seed(self.args.config.seed, "repeat_letters", index))
        counts = rng.choices(
            range(1, self.args.max_count + 1), count_weights(self.args.max_count), k=self.args.groups_per_batch
        )
        return [RepeatGroupBuilder(rng.choice(LETTERS), count, self.args.group_size, self.renderer) for count in counts]


class ExactEvaluator:
    """Greedy answers to every letter and count: ``eval/exact`` and ``eval/reward``, each count weighed alike."""

    def __init__(self, renderer: Renderer, max_count: int, max_tokens: int) -> None:
        self.renderer = renderer
        self.prompts = [(letter, n) for letter in LETTERS for n in range(1, max_count + 1)]
        self.max_tokens = max_tokens

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        import trio

        exact = 0
        total = 0.0

        async def answer(letter: str, count: int) -> None:
            nonlocal exact, total
            ob, stop = self.renderer.prompt(letter, count)
            params = tinker_types.SamplingParams(max_tokens=self.max_tokens, temperature=0.0, stop=stop, seed=0)
            response = await sampling_client.sample(ob, 1, params)
            text = self.renderer.parse(list(response.sequences[0].tokens))
            exact += int(text == letter * count)
            total += reward(text, letter, count)

        async with trio.open_nursery() as nursery:
            for letter, count in self.prompts:
                nursery.start_soon(answer, letter, count)
        return {"eval/exact": exact / len(self.prompts), "eval/reward": total / len(self.prompts)}


# ---------------------------------------------------------------- main


def build(args: Args, tokenizer: LazyTokenizer) -> Experiment:
    """The dataset and the evaluator of a run with these flags."""
    renderer = Renderer(tokenizer)
    dataset = RepeatDataset(args, renderer, num_batches=4 * args.config.max_steps + 8)
    evaluator = ExactEvaluator(renderer, args.max_count, args.config.max_tokens)
    return Experiment(dataset, [evaluator], curve_keys=("eval/reward", "eval/exact"))


def main(argv: Sequence[str] | None = None, **defaults: Any) -> int:
    """Parse flags, build the run, train; return the process exit code."""
    return run_example(Args, build, argv, alphabet=ALPHABET, description=__doc__.splitlines()[0], **defaults)


if __name__ == "__main__":
    sys.exit(main())
