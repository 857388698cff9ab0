"""Each example's main(), briefly, on LocalBackend with a tiny model; and the guess-number env's merging."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import load_example, read_jsonl
from trio_rl import TokensWithLogprobs, Trajectory, Transition, trajectory_to_data
from trio_rl.backends.local import CharTokenizer
from trio_rl.cli import LazyTokenizer
from trio_rl.loop.checkpoints import CheckpointLog

TINY: dict[str, Any] = {"d_model": 16, "n_layers": 1, "n_heads": 2, "progress": False}


@pytest.mark.parametrize(
    "flags",
    [
        ["--mode", "sync"],
        ["--mode", "stream", "--num-minibatches", "2"],
        ["--mode", "async", "--staleness", "pace", "--max-steps-off-policy", "1"],
        ["--mode", "async", "--staleness", "requeue", "--loss-fn", "ppo"],
    ],
)
def test_arithmetic_runs_in_every_mode(tmp_path: Path, flags: list[str]) -> None:
    arithmetic = load_example("arithmetic")
    argv = ["--log-path", str(tmp_path), "--max-steps", "3", "--groups-per-batch", "4", "--group-size", "2"]
    argv += ["--eval-every", "2", "--save-every", "2", *flags]
    assert arithmetic.main(argv, **TINY) == 0
    records = read_jsonl(tmp_path / "metrics.jsonl")
    steps = [r for r in records if "progress/groups" in r]
    assert [r["step"] for r in steps] == [0, 1, 2]
    assert all(0.0 <= r["env/all/reward/total"] <= 1.0 for r in steps)
    assert any("eval/accuracy" in r for r in records)
    assert (tmp_path / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    checkpoint = CheckpointLog(tmp_path).last()
    assert checkpoint is not None and checkpoint.step == 3
    assert json.loads((tmp_path / "config.json").read_text())["seed"] == 0


def test_arithmetic_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    arithmetic = load_example("arithmetic")
    argv = ["--log-path", str(tmp_path), "--groups-per-batch", "2", "--group-size", "2", "--mode", "sync"]
    assert arithmetic.main([*argv, "--max-steps", "2"], **TINY) == 0
    assert arithmetic.main([*argv, "--max-steps", "4", "--resume"], **TINY) == 0
    steps = [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl") if "progress/groups" in r]
    assert steps == [0, 1, 2, 3]


def test_arithmetic_reward_is_exact_or_partial() -> None:
    arithmetic = load_example("arithmetic")
    tokenizer = CharTokenizer(arithmetic.ALPHABET)
    renderer = arithmetic.Renderer(LazyTokenizer(tokenizer))
    env = arithmetic.AdditionEnv(3, 4, renderer, near_miss_reward=0.5)

    async def reward(text: str, eos: bool = False) -> float:
        tokens = tokenizer.encode(text) + ([tokenizer.eos_token_id] if eos else [])
        reward: float = (await env.step(tokens)).reward
        return reward

    import trio

    assert trio.run(reward, "7") == 1.0
    assert trio.run(reward, "7", True) == 1.0
    assert trio.run(reward, "6") == pytest.approx(0.4)
    assert trio.run(reward, "2") == 0.0
    assert trio.run(reward, "+") == 0.0
    assert trio.run(env.initial_observation)[0].to_ints() == [tokenizer.bos_token_id, *tokenizer.encode("3+4=")]


def test_guess_number_runs_and_merges_turns(tmp_path: Path) -> None:
    guess_number = load_example("guess_number")
    argv = ["--log-path", str(tmp_path), "--max-steps", "3", "--groups-per-batch", "2", "--group-size", "4"]
    assert guess_number.main([*argv, "--eval-every", "3"], **TINY) == 0
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records if "progress/groups" in r] == [0, 1, 2]
    assert any("eval/win_rate" in r for r in records)


def test_guess_number_observations_extend_so_an_episode_is_one_datum() -> None:
    guess_number = load_example("guess_number")
    import trio

    tokenizer = CharTokenizer(guess_number.ALPHABET)
    env = guess_number.GuessEnv(5, guess_number.Dialogue(LazyTokenizer(tokenizer)), max_turns=4, format_reward=0.05)
    eos = tokenizer.eos_token_id

    async def play() -> Trajectory:
        ob, _ = await env.initial_observation()
        transitions = []
        for guess in ("3", "7", "5"):
            action = [*tokenizer.encode(guess), eos]
            result = await env.step(action)
            assert result.next_observation.to_ints()[: ob.length] == ob.to_ints()
            transitions.append(
                Transition(ob, TokensWithLogprobs(action, [-1.0, -1.0]), result.reward, result.episode_done, result.metrics)
            )
            ob = result.next_observation
            if result.episode_done:
                break
        return Trajectory(transitions, ob)

    trajectory = trio.run(play)
    assert len(trajectory.transitions) == 3 and trajectory.transitions[-1].episode_done
    assert tokenizer.decode(trajectory.final_ob.to_ints()) == "guess:3 higher:7 lower:5"
    assert sum(t.reward for t in trajectory.transitions) == pytest.approx(1.15)
    (datum,) = trajectory_to_data(trajectory, advantage=1.0)
    advantages = list(datum.loss_fn_inputs["advantages"].data)
    assert sum(1 for a in advantages if a) == 6  # three guesses of two tokens; the env's words are masked


def test_embedding_host_stops_the_run_early(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    embedding = load_example("embedding")
    argv = ["--log-path", str(tmp_path), "--groups-per-batch", "2", "--group-size", "2", "--save-every", "0"]
    assert embedding.main([*argv, "--stop-after", "3", "--threshold", "2.0"], **TINY) == 0
    out = capsys.readouterr().out
    assert "stopped the run because 3 steps" in out
    checkpoint = CheckpointLog(tmp_path).last()
    assert checkpoint is not None and checkpoint.reason == "cancelled" and checkpoint.step >= 3
