"""Learn single-digit addition from scratch with RL: the prompt is ``a+b=``, the policy answers.

    python examples/arithmetic.py                 # async RL on LocalBackend: about 2-3 minutes on 2 CPU cores
    python examples/arithmetic.py --mode sync     # on-policy
    python examples/arithmetic.py --backend tinker --model meta-llama/Llama-3.2-1B

The policy is a tiny transformer with random weights over the characters
``0123456789+=`` (LocalBackend), so it starts out answering at random. The
problems are ``a+b`` with ``a, b >= 0`` and ``a + b <= 9`` (55 of them), and the
answer is one token. The reward is 1 for the exact sum, and partial credit for
a near miss, ``--near-miss-reward * (1 - distance / 5)`` (0.4 for one off by
default): without it the policy settles on one answer for every problem
before it learns to read the digits. Sums are drawn uniformly, so a constant
answer earns no more than chance. The random policy's mean reward is about
0.15 (2% exact answers); the default run passes 0.9 in a few hundred steps.
Every ``--eval-every`` steps an evaluator answers all 55 problems greedily
and logs ``eval/accuracy``.

The run folder (``--log-path``) gets ``metrics.jsonl``, ``checkpoints.jsonl``
with the saved states, and ``reward_curve.png``. Ctrl-C saves the last completed
step and exits with code 130; ``--resume`` continues from the last checkpoint.
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

ALPHABET = "0123456789+="
"""The LocalBackend tokenizer's characters: digits and the two operators, nothing else."""


# ---------------------------------------------------------------- configuration

CONFIG = Config(
    log_path="runs/arithmetic",
    learning_rate=1e-3,  # a tiny model trained from scratch: ten times Config's fine-tuning rate
    max_tokens=1,  # one digit (Tinker's tokenizer gets at least 4, see build)
    max_steps=600,
    eval_every=50,
    save_every=100,
    save_on_cancel=True,  # Ctrl-C saves the last completed step
)
"""Where this example departs from Config's defaults; every plain Config field is also a flag (``--learning-rate``)."""


@dataclass
class Args(CommonArgs):
    """Flags of this example; every field is a ``--flag`` (underscores become dashes)."""

    config: Config = CONFIG
    groups_per_batch: int = 16
    """problems per training step"""
    group_size: int = 16
    """answers sampled per problem"""
    max_sum: int = 9
    """problems are a+b with a, b >= 0 and a+b <= max_sum (9: one-digit answers)"""
    near_miss_reward: float = 0.5
    """most partial credit for a wrong number; shrinks to 0 at 5 away (0: none)"""


# ---------------------------------------------------------------- the environment


class Renderer:
    """Turns a problem into an observation and an action back into text.

    With the LocalBackend's character tokenizer the prompt is ``<bos>a+b=`` and
    the answer ends at end-of-sequence. With a real tokenizer (Tinker) the
    prompt is a line of text and the answer ends at a newline. The tokenizer is
    looked at only once rollouts start, when Tinker's is known.
    """

    def __init__(self, tokenizer: LazyTokenizer) -> None:
        self.tokenizer = tokenizer

    def _char_tokenizer(self) -> Any:
        real = self.tokenizer.get()
        return real if getattr(real, "alphabet", None) is not None else None

    def prompt(self, a: int, b: int) -> tuple[Observation, StopCondition]:
        chars = self._char_tokenizer()
        if chars is not None:
            tokens = [chars.bos_token_id, *chars.encode(f"{a}+{b}=")]
            return tinker_types.ModelInput.from_ints(tokens), [chars.eos_token_id]
        text = f"Answer with the number only.\n{a}+{b}="
        return tinker_types.ModelInput.from_ints(self.tokenizer.encode(text)), ["\n"]

    def parse(self, action: Sequence[int]) -> tuple[str, bool]:
        """The answer's text, and whether it is a number: only digits, then
        end-of-sequence or the end of ``max_tokens``."""
        chars = self._char_tokenizer()
        if chars is not None:
            body = list(action[:-1]) if action and action[-1] == chars.eos_token_id else list(action)
            text = chars.decode(body)
            # Special tokens decode to nothing: every token of the body must be a character.
            return text, bool(text) and len(text) == len(body) and text.isdigit()
        text = self.tokenizer.decode(action).strip()
        return text, bool(text) and text.isdigit()


class AdditionEnv(Env):
    """One problem, one turn: reward 1 for the exact sum, partial credit for a near miss."""

    def __init__(self, a: int, b: int, renderer: Renderer, near_miss_reward: float) -> None:
        self.a, self.b = a, b
        self.renderer = renderer
        self.near_miss_reward = near_miss_reward

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return self.renderer.prompt(self.a, self.b)

    async def step(self, action: list[int]) -> StepResult:
        answer, is_number = self.renderer.parse(action)
        distance = abs(int(answer) - (self.a + self.b)) if is_number else None
        if distance == 0:
            reward = 1.0
        elif distance is not None:
            reward = self.near_miss_reward * max(0.0, 1.0 - distance / 5)
        else:
            reward = 0.0
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker_types.ModelInput.from_ints([]),
            next_stop_condition=[],
            metrics={"correct": float(distance == 0), "is_number": float(is_number)},
        )


@dataclass
class AdditionGroupBuilder(EnvGroupBuilder):
    """``group_size`` copies of one problem; their rewards are centred together."""

    a: int
    b: int
    group_size: int
    renderer: Renderer
    near_miss_reward: float

    async def make_envs(self) -> Sequence[Env]:
        return [await self.make_env(i) for i in range(self.group_size)]

    async def make_env(self, index: int) -> Env:
        return AdditionEnv(self.a, self.b, self.renderer, self.near_miss_reward)

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return ["small" if self.a + self.b < 5 else "large"]


def problems(max_sum: int) -> list[tuple[int, int]]:
    """Every ``(a, b)`` with ``a, b >= 0`` and ``a + b <= max_sum``."""
    return [(a, s - a) for s in range(max_sum + 1) for a in range(s + 1)]


class AdditionDataset(RLDataset):
    """``num_batches`` batches of random problems; batch ``i`` depends only on (seed, i).

    The sum is drawn uniformly, then ``a``: so every answer is equally common and
    answering the same number to everything earns no more than chance.
    """

    def __init__(self, args: Args, renderer: Renderer, num_batches: int) -> None:
        self.args = args
        self.renderer = renderer
        self.num_batches = num_batches

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        rng = random.Random(derive_seed(self.args.config.seed, "arithmetic", index))
        builders = []
        for _ in range(self.args.groups_per_batch):
            total = rng.randint(0, self.args.max_sum)
            a = rng.randint(0, total)
            builders.append(
                AdditionGroupBuilder(a, total - a, self.args.group_size, self.renderer, self.args.near_miss_reward)
            )
        return builders


class AccuracyEvaluator:
    """Greedy accuracy on every problem of the task (a fixed set: the task has no unseen problems)."""

    def __init__(self, renderer: Renderer, max_sum: int, max_tokens: int) -> None:
        self.renderer = renderer
        self.problems = problems(max_sum)
        self.max_tokens = max_tokens

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        import trio

        correct = 0

        async def answer(a: int, b: int) -> None:
            nonlocal correct
            ob, stop = self.renderer.prompt(a, b)
            params = tinker_types.SamplingParams(max_tokens=self.max_tokens, temperature=0.0, stop=stop, seed=0)
            response = await sampling_client.sample(ob, 1, params)
            text, is_number = self.renderer.parse(list(response.sequences[0].tokens))
            correct += int(is_number and int(text) == a + b)

        async with trio.open_nursery() as nursery:
            for a, b in self.problems:
                nursery.start_soon(answer, a, b)
        return {"eval/accuracy": correct / len(self.problems)}


# ---------------------------------------------------------------- main


def build(args: Args, tokenizer: LazyTokenizer) -> Experiment:
    """The dataset and the evaluator of a run with these flags."""
    max_tokens = args.config.max_tokens
    if args.backend == "tinker":
        # A real tokenizer may split a number and needs a newline to end it.
        max_tokens = max(max_tokens, 4)
    renderer = Renderer(tokenizer)
    # Enough batches for every step even when groups are resampled; max_steps ends the run.
    dataset = AdditionDataset(args, renderer, num_batches=4 * args.config.max_steps + 8)
    evaluator = AccuracyEvaluator(renderer, args.max_sum, max_tokens)
    return Experiment(dataset, [evaluator], curve_keys=("eval/accuracy",), config_overrides={"max_tokens": max_tokens})


def main(argv: Sequence[str] | None = None, **defaults: Any) -> int:
    """Parse flags, build the run, train; return the process exit code."""
    return run_example(Args, build, argv, alphabet=ALPHABET, description=__doc__.splitlines()[0], **defaults)


if __name__ == "__main__":
    sys.exit(main())
