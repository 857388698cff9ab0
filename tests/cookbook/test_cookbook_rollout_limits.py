"""tinker-cookbook 0.6.1's rollout limits and parse-error policy, rolled out by trio_rl and by 0.6.1, side by side.

The env is the cookbook's own tool-use agent env (``build_agent_tool_env``), the policy a scripted
one in the qwen3 renderer's tool-call format, the same tokens on both sides. 0.6.1's side is its
``rl.rollouts.do_single_rollout`` (its training loop's rollout: the runner with no configuration
but what the env advertises); trio_rl's is ``trio_rl.rl.rollouts.do_single_rollout`` on the same
asyncio loop, through the drop-in's host loop.

- ``ParseErrorPolicy`` is the env's own (``EnvFromMessageEnv.step``), so trio_rl gets 0.6.1's
  behaviour by running the env: the test shows the two trajectories are the same.
- ``RolloutLimits`` advertised by the env (``rollout_limits``): ``max_turns`` and
  ``max_tool_calls`` are enforced as 0.6.1's runner does; the token budgets and timeouts are
  refused with a one-line ``ConfigError`` naming ``rollout_limits``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import pytest
import tinker
from tinker_cookbook.completers import StopCondition, TokenCompleter
from tinker_cookbook.completers import TokensWithLogprobs as CookbookTokens
from tinker_cookbook.renderers import Message, get_renderer
from tinker_cookbook.rl import rollouts as cookbook_rollouts
from tinker_cookbook.rl.rollout_limits import ParseErrorPolicy, RolloutLimits
from tinker_cookbook.rl.rollout_presets import RolloutConfig, agentic
from tinker_cookbook.tool_use import ToolResult, build_agent_tool_env, simple_tool_result, tool

from tests.cookbook.cookbook_fixtures import as_trio_rl
from tests.cookbook.test_cookbook_tool_use import (
    Calculator,
    ToolCallingBackend,
    ToolGroupBuilder,
    run_drop_in,
    tool_use_config,
)
from trio_rl import ConfigError
from trio_rl.asyncio_bridge import open_user_code_runner
from trio_rl.cookbook.host_loop import run_as_guest
from trio_rl.rl.rollouts import do_single_rollout
from trio_rl.types import TokensWithLogprobs

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
BROKEN_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": \n</tool_call><|im_end|>'
ANSWER = "The answer is 5.<|im_end|>"
QUESTION: list[Message] = [{"role": "user", "content": "What is 2 + 3? Use the add tool."}]
TIMEOUT_S = 60.0


@tool
async def add(a: Annotated[int, "first addend"], b: Annotated[int, "second addend"]) -> ToolResult:
    """Add two integers."""
    await asyncio.sleep(0)
    return simple_tool_result(str(a + b))


async def reward(history: list[Message]) -> tuple[float, dict[str, float]]:
    return (1.0 if "5" in str(history[-1]["content"]) else 0.0), {}


class Script:
    """The reply to a prompt: a broken call first, a good call after the corrective message, then the answer."""

    def __init__(self, tokenizer: Any, first: str) -> None:
        self.tokenizer = tokenizer
        self.first = first

    def reply(self, prompt: tinker.ModelInput) -> list[int]:
        text = self.tokenizer.decode(prompt.to_ints())
        if "<tool_response>" in text:
            chosen = ANSWER
        elif "formatting issue" in text:
            chosen = CALL
        else:
            chosen = self.first
        return list(self.tokenizer.encode(chosen, add_special_tokens=False))


class CookbookCompleter(TokenCompleter):
    """0.6.1's side: a TokenCompleter."""

    def __init__(self, script: Script) -> None:
        self.script = script

    async def __call__(
        self, model_input: tinker.ModelInput, stop: StopCondition, *, max_tokens: int | None = None
    ) -> CookbookTokens:
        tokens = self.script.reply(model_input)
        return CookbookTokens(tokens=tokens, maybe_logprobs=[-0.5] * len(tokens), stop_reason="stop")


class OurPolicy:
    """trio_rl's side: a TokenPolicy with the same replies."""

    def __init__(self, script: Script) -> None:
        self.script = script

    async def __call__(self, ob: tinker.ModelInput, stop: Any) -> TokensWithLogprobs:
        tokens = self.script.reply(ob)
        return TokensWithLogprobs(tokens=tokens, maybe_logprobs=[-0.5] * len(tokens), stop_reason="stop")


def both_sides(tokenizer: Any, first: str, **env_options: Any) -> tuple[Any, Any]:
    """One rollout of a fresh env on each side: (0.6.1's trajectory, trio_rl's)."""
    renderer = get_renderer("qwen3_disable_thinking", tokenizer)
    script = Script(tokenizer, first)

    async def theirs() -> Any:
        env = build_agent_tool_env(renderer, [add], QUESTION, reward, **env_options)
        return await asyncio.wait_for(cookbook_rollouts.do_single_rollout(CookbookCompleter(script), env), TIMEOUT_S)

    async def ours_in_trio() -> Any:
        env = build_agent_tool_env(renderer, [add], QUESTION, reward, **env_options)
        async with open_user_code_runner("auto"):
            return await do_single_rollout(OurPolicy(script), as_trio_rl(env))

    async def ours() -> Any:
        return await asyncio.wait_for(run_as_guest(ours_in_trio), TIMEOUT_S)

    return asyncio.run(theirs()), asyncio.run(ours())


def steps(trajectory: Any) -> list[tuple[list[int], list[int], float, bool, dict[str, float]]]:
    return [
        (t.ob.to_ints(), list(t.ac.tokens), t.reward, t.episode_done, dict(t.metrics)) for t in trajectory.transitions
    ]


def test_a_parse_error_policy_on_the_env_rolls_out_as_0_6_1(tokenizer: Any) -> None:
    policy = ParseErrorPolicy(max_consecutive=1, penalty_per_error=0.25, mask_error_turns=True)
    theirs, ours = both_sides(tokenizer, BROKEN_CALL, parse_error_policy=policy)
    # The broken call was retried after the corrective message, then the tool ran and the answer came.
    assert len(theirs.transitions) == 3 and theirs.transitions[0].reward == -0.25
    assert theirs.transitions[0].metrics.get("parse_error_masked") == 1.0
    assert steps(ours) == steps(theirs)
    assert ours.stop_reason == theirs.stop_reason == "completed"
    assert ours.final_ob.to_ints() == theirs.final_ob.to_ints()


@pytest.mark.parametrize("first", [CALL, BROKEN_CALL], ids=["call", "broken_call"])
def test_max_turns_in_the_envs_rollout_limits_stops_as_0_6_1s_runner(tokenizer: Any, first: str) -> None:
    # The env's own cap is 5 turns; the limits it advertises to the runner say 1.
    config = RolloutConfig(limits=RolloutLimits(max_turns=1))
    theirs, ours = both_sides(tokenizer, first, max_turns=5, rollout_config=config)
    assert len(theirs.transitions) == 1 and theirs.stop_reason in ("max_turns", "parse_error")
    assert steps(ours) == steps(theirs)
    assert ours.stop_reason == theirs.stop_reason


def test_max_tool_calls_in_the_envs_rollout_limits_stops_as_0_6_1(tokenizer: Any) -> None:
    config = RolloutConfig(limits=RolloutLimits(max_tool_calls=1))
    theirs, ours = both_sides(tokenizer, CALL, rollout_config=config)
    assert steps(ours) == steps(theirs)
    assert ours.stop_reason == theirs.stop_reason


class LimitedGroupBuilder(ToolGroupBuilder):
    """The tool-use group, its envs built with a RolloutConfig (0.6.1's agentic preset)."""

    async def make_envs(self) -> Sequence[Any]:
        return [build_agent_tool_env(self.renderer, [add], QUESTION, reward, rollout_config=agentic())]


def test_token_budgets_in_the_envs_rollout_limits_are_refused_in_one_line(tmp_path: Path, tokenizer: Any) -> None:
    renderer = get_renderer("qwen3_disable_thinking", tokenizer)
    builder = LimitedGroupBuilder(renderer, calculator=Calculator())  # unused: its envs call this module's add
    # A tolerant strategy would skip a failing group: this one must not be.
    config = tool_use_config(tmp_path, builder, "recipe_rollout_limits_test", rollout_error_tolerance=True)
    backend = ToolCallingBackend(tokenizer)
    with pytest.RaisesGroup(
        pytest.RaisesExc(
            ConfigError, match=r"^rollout_limits: EnvFromMessageEnv sets max_trajectory_tokens=65536, which"
        ),
        flatten_subgroups=True,
    ) as caught:
        run_drop_in(config, backend, TIMEOUT_S)
    assert "\n" not in str(caught.value.exceptions[0])
    assert [c.kind for c in backend.calls].count("forward_backward") == 0
