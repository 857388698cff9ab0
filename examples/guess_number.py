"""Multi-turn RL: guess a secret digit; after each wrong guess the env says "higher" or "lower".

    python examples/guess_number.py                   # async RL on LocalBackend
    python examples/guess_number.py --mode sync --max-steps 50

An episode is one conversation over a growing token sequence::

    <bos>guess:3<eos> higher:7<eos> lower:5<eos>        (secret 5, found on turn 3)

Each turn's observation is the previous observation plus the policy's guess
plus the env's answer, so it extends the sequence so far and the whole episode
trains as ONE Datum (the env's tokens are masked out, the guesses carry the
episode's advantage). The reward is 1 for finding the secret within
``--max-turns`` guesses, plus ``--format-reward`` per well-formed guess (a
digit, then end-of-sequence); a malformed guess ends the episode. A policy that
uses the hints needs at most 4 guesses for 10 digits, so the success rate can
climb from the random baseline (about 0.35 for well-formed random guesses, far
less for the random initial policy) towards 1.
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
    Observation,
    RLDataset,
    SamplingClient,
    StepResult,
    StopCondition,
    derive_seed,
)
from trio_rl.cli import CommonArgs, Experiment, LazyTokenizer, run_example

ALPHABET = "0123456789 :abcdeghilorsuw"
"""Digits and the letters of "guess", "higher", "lower" (LocalBackend's character tokenizer)."""


# ---------------------------------------------------------------- configuration

CONFIG = Config(
    log_path="runs/guess_number",
    learning_rate=2e-3,  # a tiny model trained from scratch
    loss_fn="ppo",  # in every mode: an async run trains it in place of the backend's default loss
    max_tokens=2,  # a guess is a digit and end-of-sequence
    max_steps=150,
    eval_every=25,
    save_every=50,
    save_on_cancel=True,  # Ctrl-C saves the last completed step
)
"""Where this example departs from Config's defaults; every plain Config field is also a flag (``--learning-rate``)."""


@dataclass
class Args(CommonArgs):
    """Flags of this example; every field is a ``--flag`` (underscores become dashes)."""

    config: Config = CONFIG
    max_turns: int = 4
    """most guesses per game; each wrong one is answered with higher or lower"""
    format_reward: float = 0.05
    """reward per well-formed guess (a digit, then end-of-sequence)"""


# ---------------------------------------------------------------- the environment


class Dialogue:
    """Renders the conversation. With a character tokenizer a guess ends at end-of-sequence;
    with a real tokenizer (Tinker) at a newline."""

    def __init__(self, tokenizer: LazyTokenizer) -> None:
        self.tokenizer = tokenizer

    def _chars(self) -> Any:
        real = self.tokenizer.get()
        return real if getattr(real, "alphabet", None) is not None else None

    def opening(self) -> tuple[list[int], StopCondition]:
        chars = self._chars()
        if chars is not None:
            return [chars.bos_token_id, *chars.encode("guess:")], [chars.eos_token_id]
        return self.tokenizer.encode("I picked a digit from 0 to 9. Guess it, one digit per line.\nguess:"), ["\n"]

    def reply(self, text: str) -> list[int]:
        chars = self._chars()
        return self.tokenizer.encode(f" {text}:" if chars is not None else f"{text}\nguess:")

    def parse(self, action: Sequence[int]) -> int | None:
        """The guessed digit, or None for anything but one digit and a proper ending."""
        chars = self._chars()
        if chars is not None:
            if len(action) != 2 or action[-1] != chars.eos_token_id:
                return None
            text = chars.decode(action[:-1])
        else:
            decoded = self.tokenizer.decode(action)
            if not decoded.endswith("\n"):
                return None
            text = decoded.strip()
        return int(text) if len(text) == 1 and text.isdigit() else None


class GuessEnv(Env):
    """One secret digit; up to ``max_turns`` guesses, each answered "higher" or "lower"."""

    def __init__(self, secret: int, dialogue: Dialogue, max_turns: int, format_reward: float) -> None:
        self.secret = secret
        self.dialogue = dialogue
        self.max_turns = max_turns
        self.format_reward = format_reward
        self.tokens: list[int] = []
        self.turn = 0

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        self.tokens, stop = self.dialogue.opening()
        self.stop = stop
        return tinker_types.ModelInput.from_ints(self.tokens), stop

    async def step(self, action: list[int]) -> StepResult:
        self.turn += 1
        guess = self.dialogue.parse(action)
        self.tokens = self.tokens + list(action)
        done = guess is None or guess == self.secret or self.turn >= self.max_turns
        reward = 0.0 if guess is None else self.format_reward
        if guess == self.secret:
            reward += 1.0
        answer = "found it" if guess == self.secret else "malformed" if guess is None else "out of turns"
        if guess is not None and guess != self.secret and not done:
            answer = "higher" if self.secret > guess else "lower"
            self.tokens += self.dialogue.reply(answer)
        metrics = {"found": float(guess == self.secret), "malformed": float(guess is None)} if done else {}
        if done:
            metrics["turns"] = float(self.turn)
        return StepResult(
            reward=reward,
            episode_done=done,
            next_observation=tinker_types.ModelInput.from_ints(self.tokens),
            next_stop_condition=self.stop,
            metrics=metrics,
            # Shown beside the turn in a transcript (--transcripts-every).
            logs={"guess": "none" if guess is None else guess, "secret": self.secret, "answer": answer},
        )


@dataclass
class GuessGroupBuilder(EnvGroupBuilder):
    """``group_size`` games with the same secret."""

    secret: int
    args: Args
    dialogue: Dialogue

    async def make_envs(self) -> Sequence[Env]:
        return [await self.make_env(i) for i in range(self.args.group_size)]

    async def make_env(self, index: int) -> Env:
        return GuessEnv(self.secret, self.dialogue, self.args.max_turns, self.args.format_reward)

    def logging_tags(self) -> list[str]:
        return ["guess_number"]


class GuessDataset(RLDataset):
    """Batches of random secrets; batch ``i`` depends only on (seed, i)."""

    def __init__(self, args: Args, dialogue: Dialogue, num_batches: int) -> None:
        self.args = args
        self.dialogue = dialogue
        self.num_batches = num_batches

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        rng = random.Random(derive_seed(self.args.config.seed, "guess_number", index))
        return [
            GuessGroupBuilder(rng.randrange(10), self.args, self.dialogue) for _ in range(self.args.groups_per_batch)
        ]


class WinRateEvaluator:
    """Plays each secret 0..9 greedily; logs the share found and the mean guesses used."""

    def __init__(self, args: Args, dialogue: Dialogue) -> None:
        self.args = args
        self.dialogue = dialogue

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        found = 0
        turns = 0
        for secret in range(10):
            env = GuessEnv(secret, self.dialogue, self.args.max_turns, 0.0)
            ob, stop = await env.initial_observation()
            while True:
                params = tinker_types.SamplingParams(
                    max_tokens=self.args.config.max_tokens, temperature=0.0, stop=stop, seed=0
                )
                response = await sampling_client.sample(ob, 1, params)
                result = await env.step(list(response.sequences[0].tokens))
                if result.episode_done:
                    found += int(result.reward >= 1.0)
                    turns += env.turn
                    break
                ob = result.next_observation
        return {"eval/win_rate": found / 10, "eval/turns": turns / 10}


# ---------------------------------------------------------------- main


def build(args: Args, tokenizer: LazyTokenizer) -> Experiment:
    """The dataset and the evaluator of a run with these flags."""
    dialogue = Dialogue(tokenizer)
    dataset = GuessDataset(args, dialogue, num_batches=4 * args.config.max_steps + 8)
    return Experiment(dataset, [WinRateEvaluator(args, dialogue)], curve_keys=("eval/win_rate",))


def main(argv: Sequence[str] | None = None, **defaults: Any) -> int:
    """Parse flags, build the run, train; return the process exit code."""
    return run_example(Args, build, argv, alphabet=ALPHABET, description=__doc__.splitlines()[0], **defaults)


if __name__ == "__main__":
    sys.exit(main())
