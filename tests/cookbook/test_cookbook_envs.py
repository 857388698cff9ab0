"""tinker-cookbook 0.6.1's own envs, datasets and evaluators, trained unchanged through trio_rl.train.

Every class under test is the cookbook's, imported from the installed package
and used as its recipes use it; only the datasets are built directly (their
builders would download a tokenizer) and the models a recipe would call are
stubs from cookbook_fixtures. Each case trains in sync, stream and async modes
on FakeBackend, with ``asyncio_bridge="auto"`` unless the case says otherwise.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import trio
from tinker_cookbook.completers import TinkerMessageCompleter
from tinker_cookbook.eval.benchmarks.gsm8k import GSM8KMessageEnv
from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset
from tinker_cookbook.recipes.math_rl.math_env import MathEnv
from tinker_cookbook.recipes.multiplayer_rl.guess_number.env import GuessNumberDataset
from tinker_cookbook.recipes.multiplayer_rl.twenty_questions.env import TwentyQuestionsDataset
from tinker_cookbook.recipes.rubric.data import Rubric, RubricBasedDatapoint
from tinker_cookbook.recipes.rubric.env import RubricGradedDataset
from tinker_cookbook.rl.message_env import EnvFromMessageEnv
from tinker_cookbook.rl.metric_util import RLTestSetEvaluator
from tinker_cookbook.rl.preference_envs import PairwisePreferenceGroupBuilder, TournamentPattern
from tinker_cookbook.rl.problem_env import ProblemGroupBuilder
from tinker_cookbook.rl.types import Env, EnvGroupBuilder

from tests.cookbook.cookbook_fixtures import (
    MODE_NAMES,
    RENDERER,
    AsyncioAnswerer,
    LengthPreference,
    ListDataset,
    ScoringGrader,
    ScriptedBackend,
    YesNoAnswerer,
    as_trio_rl,
    install_stub_textarena,
    run_training,
)
from trio_rl import DualSamplingClient, TrainResult
from trio_rl.backends.local import LocalBackend, ModelConfig

WORDS = ["apple", "river", "orange", "stone", "island", "cloud"]


def assert_trained(result: TrainResult, steps: int, groups: int, *, fake_backend: bool = True) -> None:
    """Every step trained, every group went into a step, and reward metrics were computed."""
    assert result.final_step == steps
    assert result.trained_groups == groups
    assert len(result.step_metrics) == steps
    for record in result.step_metrics:
        assert record["env/all/total_episodes"] > 0
        assert record["env/all/total_ac_tokens"] > 0
        assert record["env/all/reward/total"] == record["env/all/reward/total"]  # not NaN
        if fake_backend:
            # FakeBackend's loss is half the tokens it was sent: the groups' data reached it.
            assert record["train/loss:sum"] > 0


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_arithmetic_dataset(tmp_path: Path, mode: str) -> None:
    dataset = ArithmeticDataset(batch_size=2, renderer=RENDERER, group_size=3, n_batches=3)
    result = run_training(tmp_path, mode, dataset, 2)
    assert_trained(result, 3, 6)
    assert "env/all/format" in result.step_metrics[0]


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_math_env(tmp_path: Path, mode: str) -> None:
    problems = [("What is 1 + 1?", "2"), ("What is 2 * 3?", "6"), ("Simplify 4/2.", "2"), ("What is 3 - 1?", "2")]
    builders = [ProblemGroupBuilder(env_thunk=partial(MathEnv, q, a, RENDERER), num_envs=2) for q, a in problems]
    result = run_training(tmp_path, mode, ListDataset(builders, 2), 2)
    assert_trained(result, 2, 4)
    # The "problems" tag covers every group, so (as in the cookbook) only env/all/... is written.
    assert "env/all/correct" in result.step_metrics[0]
    assert not any(key.startswith("env/problems/") for key in result.step_metrics[0])


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_guess_number_dataset(tmp_path: Path, mode: str) -> None:
    dataset = GuessNumberDataset(answers=[3, 14, 159, 265, 358, 979], renderer=RENDERER, batch_size=2, group_size=2)
    result = run_training(tmp_path, mode, dataset, 2)
    assert_trained(result, 3, 6)
    # Random guesses rarely hit: most episodes run to the turn limit (10 turns).
    assert result.step_metrics[0]["env/all/turns_per_episode"] > 1


@pytest.mark.parametrize("answerer_type", [YesNoAnswerer, AsyncioAnswerer], ids=["pure-python", "asyncio"])
@pytest.mark.parametrize("mode", MODE_NAMES)
def test_twenty_questions(tmp_path: Path, mode: str, answerer_type: type[YesNoAnswerer | AsyncioAnswerer]) -> None:
    answerer = answerer_type()
    dataset = TwentyQuestionsDataset(answerer=answerer, answers=WORDS[:4], renderer=RENDERER, batch_size=2, group_size=2)
    result = run_training(tmp_path, mode, dataset, 2)
    assert_trained(result, 2, 4)
    assert answerer.calls >= 4 * 2


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_twenty_questions_with_the_cookbooks_tinker_completer(tmp_path: Path, mode: str) -> None:
    """The answerer is the cookbook's TinkerMessageCompleter over a trio_rl sampling client."""
    holder: dict[str, Any] = {}

    class LateCompleter(TinkerMessageCompleter):
        # The sampling client exists only once the backend is entered.
        def __init__(self) -> None:
            pass

    completer = LateCompleter()

    async def setup(backend: Any) -> None:
        training = await backend.create_training_client(base_model="answerer")
        client = DualSamplingClient(await training.save_weights_for_sampler("answerer"))
        TinkerMessageCompleter.__init__(completer, sampling_client=client, renderer=RENDERER, max_tokens=5)  # type: ignore[arg-type]
        holder["client"] = client

    dataset = TwentyQuestionsDataset(answerer=completer, answers=WORDS[:4], renderer=RENDERER, batch_size=2, group_size=2)
    result = run_training(tmp_path, mode, dataset, 2, setup=setup)
    assert_trained(result, 2, 4)
    assert isinstance(holder["client"], DualSamplingClient)


class GSM8KGroupBuilder(EnvGroupBuilder):
    """GSM8K's MessageEnv under the cookbook's EnvFromMessageEnv adapter (as its benchmark builder wires it)."""

    def __init__(self, question: str, expected: str, group_size: int, max_trajectory_tokens: int | None = None) -> None:
        self.question, self.expected, self.group_size = question, expected, group_size
        self.max_trajectory_tokens = max_trajectory_tokens

    async def make_envs(self) -> list[Env]:
        return [
            EnvFromMessageEnv(
                RENDERER,
                GSM8KMessageEnv(self.question, self.expected),
                max_trajectory_tokens=self.max_trajectory_tokens,
                max_generation_tokens=12,
            )
            for _ in range(self.group_size)
        ]


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_message_env(tmp_path: Path, mode: str) -> None:
    questions = [("Tom has 3 apples and buys 4 more. How many?", "7"), ("What is 10 - 4?", "6")] * 2
    builders = [GSM8KGroupBuilder(q, a, 4) for q, a in questions]
    # Half the samples answer " 7" in the role_colon format (right for one question, wrong for the other).
    result = run_training(tmp_path, mode, ListDataset(builders, 2), 2, backend=ScriptedBackend(" 7\n\nUser:"))
    assert_trained(result, 2, 4)
    records = result.step_metrics
    # GSM8KMessageEnv.step graded the well-formed replies: 1 for "7" on the first question, 0 on the
    # second. Which questions share a step depends, in async mode on the real clock, on which groups
    # finish first, so a step may hold only one of them: across the run both grades appear.
    correct = [r["env/all/correct"] for r in records]
    assert any(c > 0 for c in correct) and any(c < 1 for c in correct), correct
    # The random ones ended in EnvFromMessageEnv: a parse error, or, when max_tokens was reached,
    # the stop_reason="length" that step() got in extra=.
    assert all("env/all/stop/parse_error" in r or "env/all/stop/max_tokens" in r for r in records)


def test_message_env_initial_observation_overflow_is_kept_and_counted(tmp_path: Path) -> None:
    long_q = "Count the words in this sentence, please, all of them. " * 3
    builders = [GSM8KGroupBuilder(long_q, "10", 2, max_trajectory_tokens=40), GSM8KGroupBuilder("1+1?", "2", 2, 400)]
    result = run_training(tmp_path, "sync", ListDataset(builders, 2), 2)
    assert_trained(result, 1, 2)
    record = result.step_metrics[0]
    assert record["rollouts/initial_overflow"] == 2
    assert record["env/all/stop/max_tokens"] > 0


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_rubric_graded_env(tmp_path: Path, mode: str) -> None:
    grader = ScoringGrader()
    datapoints = [
        RubricBasedDatapoint(
            convo=[{"role": "user", "content": f"Write a greeting for person {i}."}],
            rubric_items=[Rubric("Is it polite?"), Rubric("Is it short?")],
        )
        for i in range(4)
    ]
    dataset = RubricGradedDataset(renderer=RENDERER, batch_size=2, group_size=2, datapoints=datapoints, grader_llm=grader)
    result = run_training(tmp_path, mode, dataset, 2)
    assert_trained(result, 2, 4)
    # RubricGradedEnv.step gathers one grading per rubric item with asyncio.gather.
    assert grader.calls == 4 * 2 * 2


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_two_player_self_play_with_a_stub_game(tmp_path: Path, mode: str) -> None:
    install_stub_textarena()
    from tinker_cookbook.recipes.multiplayer_rl.text_arena.env import (
        TwoPlayerEnvGroupBuilder,
        TwoPlayerTextArenaDataset,
    )

    builder = TwoPlayerEnvGroupBuilder(game_name="Stub-v0", renderer=RENDERER, num_envs=2, self_play=True)
    dataset = TwoPlayerTextArenaDataset(batch_size=2, builder=builder, num_datapoints=6)
    result = run_training(tmp_path, mode, dataset, 1)
    assert_trained(result, 3, 3)
    # Each player moved twice in the 4-move game, waiting on the shared asyncio.Condition in between.
    assert result.step_metrics[0]["env/all/turns_per_episode"] == 2


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_pairwise_preference_group_builder(tmp_path: Path, mode: str) -> None:
    preference = LengthPreference()
    builders = [
        PairwisePreferenceGroupBuilder(
            convo_prefix=[{"role": "user", "content": f"Describe color number {i}."}],
            policy_renderer=RENDERER,
            tournament_pattern=TournamentPattern.ALL_PAIRS_ONE_WAY,
            preference_model=preference,
            num_envs=3,
        )
        for i in range(4)
    ]
    result = run_training(tmp_path, mode, ListDataset(builders, 2), 2)
    assert_trained(result, 2, 4)
    assert preference.calls == 4 * 3  # 3 pairs per group of 3
    assert "env/all/win_minus_loss" in result.step_metrics[0]


@pytest.mark.parametrize("mode", MODE_NAMES)
def test_rl_test_set_evaluator(tmp_path: Path, mode: str) -> None:
    test_set = ArithmeticDataset(batch_size=2, renderer=RENDERER, group_size=2, n_batches=1)
    evaluator = RLTestSetEvaluator(test_set, max_tokens=8, name="test")
    dataset = ArithmeticDataset(batch_size=2, renderer=RENDERER, group_size=2, n_batches=2)
    result = run_training(tmp_path, mode, dataset, 2, evaluators=[evaluator], eval_every=1)
    assert_trained(result, 2, 4)
    evals = [r for r in result.metrics if "test/env/all/reward/total" in r]
    assert len(evals) == 3  # the initial weights, step 1, step 2 (the final ones)
    assert all(r["test/env/all/total_episodes"] == 4 for r in evals)


def test_arithmetic_on_local_backend_with_a_cookbook_renderer(tmp_path: Path) -> None:
    """The renderer is built over LocalBackend's own tokenizer; the model really samples and trains."""
    from tinker_cookbook.renderers import get_renderer
    from tinker_cookbook.tokenizer_utils import Tokenizer

    holder: dict[str, Any] = {}

    async def main() -> TrainResult:
        from trio_rl import Config, train

        backend = LocalBackend(log_dir=tmp_path / "local", model_config=ModelConfig(), seed=0)
        with trio.fail_after(300):
            async with backend:
                probe = await backend.create_training_client(base_model="tiny")
                # As cookbook_fixtures.RENDERER's: role_colon needs only what trio_rl's tokenizers have.
                renderer = get_renderer("role_colon", cast(Tokenizer, await probe.get_tokenizer()))
                holder["renderer"] = renderer
                dataset = ArithmeticDataset(batch_size=2, renderer=renderer, group_size=2, n_batches=2)
                config = Config(log_path=tmp_path / "run", eval_every=0, save_every=0, max_tokens=6, learning_rate=1e-3)
                return await train(config, dataset=as_trio_rl(dataset), backend=backend)

    result = trio.run(main)
    assert_trained(result, 2, 4, fake_backend=False)
    assert all(r["train/loss:sum"] == r["train/loss:sum"] for r in result.step_metrics)  # a real, finite loss
    assert result.checkpoint is not None and result.checkpoint.step == 2
    assert holder["renderer"].get_stop_sequences() == ["\n\nUser:"]


# ---------------------------------------------------------------- the bridge is what makes them run


def _rubric_dataset() -> Any:
    datapoints = [RubricBasedDatapoint(convo=[{"role": "user", "content": "Hi."}], rubric_items=[Rubric("Polite?")])] * 2
    return RubricGradedDataset(renderer=RENDERER, batch_size=2, group_size=2, datapoints=datapoints, grader_llm=ScoringGrader())


def _message_dataset() -> Any:
    return ListDataset([GSM8KGroupBuilder("What is 1 + 1?", "2", 2)] * 2, 2)


def _evaluator_case() -> tuple[Any, list[Any]]:
    test_set = ArithmeticDataset(batch_size=1, renderer=RENDERER, group_size=2, n_batches=1)
    return ArithmeticDataset(batch_size=2, renderer=RENDERER, group_size=2, n_batches=1), [
        RLTestSetEvaluator(test_set, max_tokens=8)
    ]


@pytest.mark.parametrize("case", ["rubric (asyncio.gather)", "message env (asyncio.to_thread)", "RLTestSetEvaluator"])
def test_without_the_bridge_these_fail_as_the_issue_describes(tmp_path: Path, case: str) -> None:
    evaluators: list[Any] = []
    if case.startswith("rubric"):
        dataset = _rubric_dataset()
    elif case.startswith("message"):
        dataset = _message_dataset()
    else:
        dataset, evaluators = _evaluator_case()
    # With the bridge (auto) the case trains...
    result = run_training(tmp_path / "auto", "sync", dataset, 2, evaluators=evaluators)
    assert result.final_step == len(dataset)
    # ...and with asyncio_bridge="never" it fails the way it does under plain Trio.
    failures: list[BaseException] = []
    try:
        run_training(tmp_path / "never", "sync", dataset, 2, evaluators=evaluators, asyncio_bridge="never")
    except* (RuntimeError, TypeError, AttributeError) as group:
        failures.extend(group.exceptions)
    assert failures
