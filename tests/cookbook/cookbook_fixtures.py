"""What the tinker-cookbook suite shares: a local tokenizer and renderer, stubs, and a runner.

Nothing here downloads anything: the renderer is the cookbook's ``role_colon``
over trio_rl's character tokenizer, and the models a recipe would call (an
answerer, a grader, a preference model, a TextArena game) are small stubs.
"""

from __future__ import annotations

import asyncio
import string
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast, overload

import trio
from tinker import types as tinker_types
from tinker_cookbook.completers import MessageCompleter
from tinker_cookbook.preference.types import Comparison, PreferenceModel
from tinker_cookbook.renderers import Message, get_renderer
from tinker_cookbook.rl import types as cookbook_types
from tinker_cookbook.tokenizer_utils import Tokenizer

from trio_rl import AsyncConfig, Config, StreamMinibatchConfig, TrainResult, train
from trio_rl import _tinker_compat as compat
from trio_rl.backends.local import CharTokenizer
from trio_rl.testing import FakeBackend, FakeSamplerModel, FakeSamplingClient, FakeTrainingClient
from trio_rl.testing.service import FakeService
from trio_rl.types import Env, RLDataset

ALPHABET = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")
"""Printable ASCII and newline: every prompt the recipes build here."""

TOKENIZER = CharTokenizer(ALPHABET)
# The cookbook types a tokenizer as transformers' PreTrainedTokenizer; the role_colon renderer
# calls only encode, decode, eos_token_id and bos_token, which CharTokenizer has.
RENDERER = get_renderer("role_colon", cast(Tokenizer, TOKENIZER))

RUN_TIMEOUT_S = 120.0
"""Wall-clock seconds one small run may take before it counts as hung."""

MODE_NAMES = ("sync", "stream", "async")


def mode_config(mode: str, groups_per_batch: int) -> dict[str, Any]:
    """The Config fields that select ``mode`` for batches of ``groups_per_batch`` groups."""
    if mode == "sync":
        return {}
    if mode == "stream":
        minibatches = 2 if groups_per_batch % 2 == 0 else 1
        return {"stream_minibatch_config": StreamMinibatchConfig(groups_per_batch, minibatches)}
    return {"async_config": AsyncConfig(max_steps_off_policy=1, groups_per_batch=groups_per_batch)}


def run_training(
    log_path: Path,
    mode: str,
    dataset: Any,
    groups_per_batch: int,
    *,
    evaluators: Sequence[Any] = (),
    backend: Any = None,
    setup: Any = None,
    **overrides: Any,
) -> TrainResult:
    """Train ``dataset`` through ``trio_rl.train`` on a FakeBackend whose tokens the renderer can decode.

    Args:
        setup: ``async (backend) -> None``, run inside the entered backend before training
            (to make sampling clients for answerers).

    Real time, not a mock clock: some cookbook code calls ``asyncio.to_thread``,
    and a thread in flight is no activity for autojump.
    """
    fields: dict[str, Any] = {
        "log_path": log_path,
        "eval_every": 0,
        "save_every": 0,
        "max_tokens": 12,
        **mode_config(mode, groups_per_batch),
        **overrides,
    }
    config = Config(**fields)

    async def main() -> TrainResult:
        chosen = backend or FakeBackend(
            seed=0, record_calls=False, sampler=FakeSamplerModel(vocab_size=TOKENIZER.vocab_size)
        )
        with trio.fail_after(RUN_TIMEOUT_S):
            async with chosen:
                if setup is not None:
                    await setup(chosen)
                return await train(config, dataset=dataset, backend=chosen, evaluators=evaluators)

    return trio.run(main)


@overload
def as_trio_rl(value: cookbook_types.RLDataset) -> RLDataset: ...


@overload
def as_trio_rl(value: cookbook_types.Env) -> Env: ...


def as_trio_rl(value: object) -> object:
    """A cookbook dataset or env, unchanged, typed as the trio_rl class a trio_rl signature names.

    trio_rl reads the cookbook's objects by the names and fields trio_rl.types mirrors, so they
    run unchanged (what this suite tests); but the cookbook's classes do not subclass trio_rl's,
    and the methods' parameters name each side's own Trajectory, so to the type checker the two
    are unrelated. The tests cross only these two: a dataset into ``trio_rl.train``, an env into
    ``do_single_rollout``.
    """
    return value


class ListDataset(cookbook_types.RLDataset):
    """The cookbook's builders in batches of ``batch_size``, in order (its dataset builders would download)."""

    def __init__(self, builders: Sequence[cookbook_types.EnvGroupBuilder], batch_size: int) -> None:
        self.builders = list(builders)
        self.batch_size = batch_size

    def get_batch(self, index: int) -> Sequence[cookbook_types.EnvGroupBuilder]:
        return self.builders[index * self.batch_size : (index + 1) * self.batch_size]

    def __len__(self) -> int:
        return len(self.builders) // self.batch_size


# ---------------------------------------------------------------- stand-ins for models a recipe would call


class _ScriptedSamplingClient(FakeSamplingClient):
    def __init__(self, backend: FakeService, version: int, model_path: str | None, reply: str) -> None:
        super().__init__(backend, version, model_path)
        self._reply = TOKENIZER.encode(reply)

    async def sample(
        self, prompt: tinker_types.ModelInput, num_samples: int, sampling_params: tinker_types.SamplingParams
    ) -> tinker_types.SampleResponse:
        response = await super().sample(prompt, num_samples, sampling_params)
        if (sampling_params.seed or 0) % 2:
            return response
        # Every other seed answers in the renderer's format, so the env's own grading runs.
        logprobs = [-0.5] * len(self._reply)
        return compat.sample_response([compat.sampled_sequence(self._reply, logprobs, "stop")] * num_samples)


class _ScriptedTrainingClient(FakeTrainingClient):
    reply = ""

    async def save_weights_for_sampler(self, name: str, *, inflight: bool = False) -> FakeSamplingClient:
        if inflight:
            raise NotImplementedError("the scripted sampler replays a snapshot only")
        plain = await super().save_weights_for_sampler(name)
        return _ScriptedSamplingClient(self._backend, plain.version, plain.model_path, self.reply)


class ScriptedBackend(FakeBackend):
    """A FakeBackend whose samples, for every other seed, are ``reply`` (random tokens otherwise)."""

    def __init__(self, reply: str) -> None:
        super().__init__(seed=0, record_calls=False, sampler=FakeSamplerModel(vocab_size=TOKENIZER.vocab_size))
        self.reply = reply

    async def create_training_client(
        self, *, base_model: str, lora_rank: int = 32, seed: int | None = None
    ) -> FakeTrainingClient:
        client = _ScriptedTrainingClient(self)
        client.reply = self.reply
        return client


class YesNoAnswerer(MessageCompleter):
    """A pure-Python answerer for twenty questions: 'yes' to questions naming a vowel-initial word."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, messages: list[Message]) -> Message:
        self.calls += 1
        last = str(messages[-1]["content"])
        return {"role": "assistant", "content": "yes" if last[:1].lower() in "aeiou" else "no"}


class AsyncioAnswerer(MessageCompleter):
    """An asyncio answerer: a contended lock and a gather, as remote completers are written."""

    def __init__(self) -> None:
        self.lock: asyncio.Lock | None = None
        self.calls = 0

    async def __call__(self, messages: list[Message]) -> Message:
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            votes = await asyncio.gather(*(self._vote(str(m["content"])) for m in messages))
            self.calls += 1
        return {"role": "assistant", "content": "yes" if sum(votes) % 2 else "no"}

    async def _vote(self, text: str) -> int:
        await asyncio.sleep(0.001)
        return len(text)


class ScoringGrader(MessageCompleter):
    """A rubric grader that scores by the length of the graded conversation, in the rubric's format."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, messages: list[Message]) -> Message:
        await asyncio.sleep(0)
        self.calls += 1
        score = len(str(messages[-1]["content"])) % 7 / 6
        return {"role": "assistant", "content": f"<score>{score:.2f}</score>"}


class LengthPreference(PreferenceModel):
    """Prefers the longer completion (an asyncio coroutine, as preference models are)."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, comparison: Comparison) -> float:
        await asyncio.sleep(0)
        self.calls += 1
        a = len(str(comparison.completion_A[-1]["content"]))
        b = len(str(comparison.completion_B[-1]["content"]))
        return 0.0 if a == b else (1.0 if b > a else -1.0)


# ---------------------------------------------------------------- a stub TextArena game


class _StubState:
    def __init__(self) -> None:
        self.current_player_id = 0
        self.done = False
        self.rewards: dict[int, float] | None = None


class StubGame:
    """A two-player game of four moves; the player who said more in total wins."""

    MOVES = 4

    def __init__(self) -> None:
        self.state = _StubState()
        self.said = {0: 0, 1: 0}
        self.moves = 0

    def reset(self, num_players: int) -> None:
        assert num_players == 2
        self.__init__()  # type: ignore[misc]

    def step(self, move: str) -> tuple[bool, dict[str, Any]]:
        player = self.state.current_player_id
        self.said[player] += len(move)
        self.moves += 1
        if self.moves >= self.MOVES:
            self.state.done = True
            winner = 0 if self.said[0] >= self.said[1] else 1
            self.state.rewards = {winner: 1.0, 1 - winner: -1.0}
        else:
            self.state.current_player_id = 1 - player
        return self.state.done, {}

    def get_observation(self) -> tuple[int, str]:
        return self.state.current_player_id, f"Move {self.moves} of {self.MOVES}. Say something, then ]"

    def close(self) -> None:
        pass


def install_stub_textarena() -> None:
    """Make ``import textarena`` give the stub game (the real package is not installed here)."""
    module = types.ModuleType("textarena")
    module.Env = StubGame  # type: ignore[attr-defined]
    module.State = _StubState  # type: ignore[attr-defined]
    module.make = lambda env_id: StubGame()  # type: ignore[attr-defined]
    sys.modules["textarena"] = module
