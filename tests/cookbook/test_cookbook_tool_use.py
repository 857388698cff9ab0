"""tinker-cookbook's tool-use agent env (``tool_use/``, a MessageEnv) runs end to end through the drop-in.

The env, its tool and its grader are the cookbook's own asyncio code
(``build_agent_tool_env``, ``@tool``, ``asyncio.gather`` over tool calls,
``asyncio.to_thread`` in ``EnvFromMessageEnv``); under the drop-in they run on
the recipe's own asyncio loop. The policy is a scripted fake that answers in
the qwen3 renderer's tool-call format, so the tool really runs: first a call
of ``add``, then, once the tool's answer is in the prompt, the final answer.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import chz
import trio
from tinker import types as tinker_types
from tinker_cookbook.renderers import Message, get_renderer
from tinker_cookbook.rl import train as cookbook
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tool_use import ToolResult, build_agent_tool_env, simple_tool_result, tool

from trio_rl import _tinker_compat as compat
from trio_rl.cookbook import train as drop_in
from trio_rl.testing import FakeBackend, FakeSamplerModel, FakeSamplingClient, FakeTrainingClient

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
ANSWER = "The answer is 5.<|im_end|>"
RUN_TIMEOUT_S = 120.0


class ToolCallingSampler:
    """Answers with a call of ``add`` until the prompt holds its result, then with the final answer."""

    def __init__(self, inner: FakeSamplingClient, tokenizer: Any) -> None:
        self._inner = inner
        self._tokenizer = tokenizer
        self.inflight = False

    @property
    def model_path(self) -> str | None:
        return self._inner.model_path

    async def sample(
        self, prompt: tinker_types.ModelInput, num_samples: int, sampling_params: tinker_types.SamplingParams
    ) -> tinker_types.SampleResponse:
        await trio.lowlevel.checkpoint()  # a Trio-native client: asyncio code reaches it through the bridge
        reply = ANSWER if "<tool_response>" in self._tokenizer.decode(prompt.to_ints()) else CALL
        tokens = self._tokenizer.encode(reply, add_special_tokens=False)
        return compat.sample_response([compat.sampled_sequence(tokens, [-0.5] * len(tokens), "stop")] * num_samples)

    async def compute_logprobs(self, prompt: tinker_types.ModelInput) -> list[float | None]:
        return await self._inner.compute_logprobs(prompt)


class _ToolCallingTrainer(FakeTrainingClient):
    tokenizer: Any = None

    async def save_weights_for_sampler(self, name: str, *, inflight: bool = False) -> Any:
        return ToolCallingSampler(await super().save_weights_for_sampler(name, inflight=inflight), self.tokenizer)


class ToolCallingBackend(FakeBackend):
    def __init__(self, tokenizer: Any) -> None:
        super().__init__(seed=0, record_calls=True, sampler=FakeSamplerModel(vocab_size=len(tokenizer)))
        self.tokenizer = tokenizer

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> FakeTrainingClient:
        await trio.lowlevel.checkpoint()
        client = _ToolCallingTrainer(self)
        client.tokenizer = self.tokenizer
        return client


class Calculator:
    """The env's tool: records where each call ran."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []

    @tool
    async def add(self, a: Annotated[int, "first addend"], b: Annotated[int, "second addend"]) -> ToolResult:
        """Add two integers."""
        # Plain asyncio, as tools are written: a sleep and a thread.
        await asyncio.sleep(0)
        total = await asyncio.to_thread(lambda: a + b)
        self.calls.append((a, b, asyncio.get_running_loop().is_running()))
        return simple_tool_result(str(total))


class ToolGroupBuilder(EnvGroupBuilder):
    def __init__(self, renderer: Any, calculator: Calculator) -> None:
        self.renderer = renderer
        self.calculator = calculator

    async def make_envs(self) -> Sequence[Any]:
        async def reward(history: list[Message]) -> tuple[float, dict[str, float]]:
            await asyncio.sleep(0)
            return (1.0 if "5" in str(history[-1]["content"]) else 0.0), {}

        question: list[Message] = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]
        return [
            build_agent_tool_env(self.renderer, [self.calculator.add], question, reward, max_turns=3) for _ in range(2)
        ]

    def logging_tags(self) -> list[str]:
        return ["tool_use"]


class ToolDataset(RLDataset):
    def __init__(self, builder: ToolGroupBuilder) -> None:
        self.builder = builder

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [self.builder]

    def __len__(self) -> int:
        return 1


@chz.chz
class ToolDatasetBuilder(RLDatasetBuilder):
    dataset: ToolDataset

    async def __call__(self) -> tuple[RLDataset, None]:
        return self.dataset, None


def tool_use_config(tmp_path: Path, builder: ToolGroupBuilder, recipe_name: str, **fields: Any) -> cookbook.Config:
    """0.6.1's rl.train Config of one step over ``builder``'s one group, logging to ``tmp_path / "run"``."""
    return cookbook.Config(
        learning_rate=1e-4,
        dataset_builder=ToolDatasetBuilder(dataset=ToolDataset(builder)),
        model_name="tiny-qwen3",
        recipe_name=recipe_name,
        max_tokens=64,
        log_path=str(tmp_path / "run"),
        eval_every=0,
        save_every=0,
        **fields,
    )


def run_drop_in(config: cookbook.Config, backend: ToolCallingBackend, timeout_s: float) -> Any:
    """The drop-in's main on ``config`` and ``backend``, on an asyncio loop of its own, within ``timeout_s``."""

    async def host() -> Any:
        return await asyncio.wait_for(drop_in.main(config, backend=backend), timeout_s)

    return asyncio.run(host())


def test_one_tool_use_rollout_runs_end_to_end_through_the_drop_in(tmp_path: Path, tokenizer: Any) -> None:
    calculator = Calculator()
    renderer = get_renderer("qwen3_disable_thinking", tokenizer)
    config = tool_use_config(tmp_path, ToolGroupBuilder(renderer, calculator), "recipe_tool_use_test")
    backend = ToolCallingBackend(tokenizer)
    result = run_drop_in(config, backend, RUN_TIMEOUT_S)
    assert result.final_step == 1 and result.trained_groups == 1
    # Each of the group's two episodes called the tool once, on a running asyncio loop.
    assert calculator.calls == [(2, 3, True), (2, 3, True)]
    step = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert step["env/all/reward/total"] == 1.0 and step["env/all/turns_per_episode"] == 2
    assert [c.kind for c in backend.calls].count("forward_backward") == 1
