"""Transcripts and timelines of a real run (examples/guess_number.py, multi-turn, on LocalBackend), and the pages in headless Chromium."""

from __future__ import annotations

import html
import itertools
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.chromium import CHROMIUM, render
from tests.conftest import load_example, read_jsonl
from tests.test_examples import TINY
from trio_rl import TokensWithLogprobs, Trajectory, TrajectoryGroup, trajectory_to_data
from trio_rl.backends.local import CharTokenizer
from trio_rl.cli import LazyTokenizer
from trio_rl.observe import GroupTranscript, TranscriptWriter
from trio_rl.rl.data import compute_advantages
from trio_rl.rl.rollouts import do_single_rollout

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium; CI installs it)"
)

FLAGS = ["--max-steps", "2", "--groups-per-batch", "2", "--group-size", "4", "--eval-every", "0", "--save-every", "0"]
OBSERVE = ["--transcripts-every", "1", "--transcript-groups", "2", "--timeline-every", "1", "--trace"]


@pytest.fixture(scope="module")
def guess_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A guess_number run with every observation flag on, its folder."""
    log_path = tmp_path_factory.mktemp("guess")
    assert load_example("guess_number").main(["--log-path", str(log_path), *FLAGS, *OBSERVE], **TINY) == 0
    return log_path


def test_multi_turn_transcripts_show_every_turn_with_the_envs_logs(guess_run: Path) -> None:
    records = read_jsonl(guess_run / "iteration_000001" / "train_rollouts.jsonl")
    assert len(records) == 2 * 4
    for record in records:
        turns = record["turns"]
        assert [t["episode_done"] for t in turns] == [False] * (len(turns) - 1) + [True]
        for before, after in itertools.pairwise(turns):
            # Each turn's observation is the last one, its guess, and the env's answer.
            assert after["observation"][: len(before["observation"]) + len(before["action"])] == (
                before["observation"] + before["action"]
            )
            assert before["logs"]["answer"] in ("higher", "lower")
            assert before["logs"]["answer"] in after["observation_text"]
        assert turns[-1]["logs"]["answer"] in ("found it", "malformed", "out of turns")
        assert record["total_reward"] == pytest.approx(sum(t["reward"] for t in turns) + record["final_reward"])
        assert all(t["token_versions"] is None or len(t["token_versions"]) == len(t["action"]) for t in turns)
    # Group-centred advantages, as trained.
    for group in {(r["batch"], r["group"]) for r in records}:
        rewards = [r["total_reward"] for r in records if (r["batch"], r["group"]) == group]
        advantages = [r["advantage"] for r in records if (r["batch"], r["group"]) == group]
        assert advantages == pytest.approx([x - sum(rewards) / len(rewards) for x in rewards])
    assert (guess_run / "trace_from_step_000000.json").exists()


def _scripted_games(log_path: Path) -> Path:
    """Two guess_number games played by a scripted policy (3, 7, 5 and 5), written as a transcript; its page."""
    guess_number = load_example("guess_number")
    tokenizer = CharTokenizer(guess_number.ALPHABET)
    dialogue = guess_number.Dialogue(LazyTokenizer(tokenizer))

    def policy(guesses: str) -> Any:
        moves = iter(guesses)

        async def next_guess(ob: Any, stop: Any) -> TokensWithLogprobs:
            return TokensWithLogprobs([*tokenizer.encode(next(moves)), tokenizer.eos_token_id], [-1.0, -1.0])

        return next_guess

    async def play() -> list[Trajectory]:
        envs = [guess_number.GuessEnv(5, dialogue, max_turns=4, format_reward=0.05) for _ in range(2)]
        return [await do_single_rollout(policy(g), env) for g, env in zip(("375", "5"), envs, strict=True)]

    group = TrajectoryGroup(trio.run(play), [0.0, 0.0], [{}, {}])
    (advantages,) = compute_advantages([group])
    data = [trajectory_to_data(t, a) for t, a in zip(group.trajectories_G, advantages, strict=True)]
    transcript = GroupTranscript.of((0, 0, 0), 0, group, advantages, data, ["guess_number"])
    return TranscriptWriter(log_path, tokenizer.decode).write("train", 0, [(transcript, True)])


def test_a_guess_number_transcript_shows_every_turn_and_the_envs_answers(tmp_path: Path) -> None:
    page = _scripted_games(tmp_path)
    (first, second) = read_jsonl(page.parent / "train_rollouts.jsonl")
    assert [t["action_text"] for t in first["turns"]] == ["3", "7", "5"]
    assert [t["logs"]["answer"] for t in first["turns"]] == ["higher", "lower", "found it"]
    assert first["turns"][2]["observation_text"] == "guess:3 higher:7 lower:"
    assert [t["logs"]["answer"] for t in second["turns"]] == ["found it"]
    text = html.unescape(page.read_text())
    assert "guess:3 higher:7 lower:" in text and text.count("turn 2: reward") == 1


@needs_chromium
def test_the_console_check_sees_a_page_that_logs_an_error(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>console.error('bad thing'); nothing();</script>")
    console = render(page).console
    assert any("bad thing" in line for line in console) and any("nothing is not defined" in line for line in console)


@needs_chromium
def test_a_transcript_page_and_a_timeline_page_render_without_console_errors(guess_run: Path) -> None:
    transcript = guess_run / "iteration_000001" / "train_transcript.html"
    shown = render(transcript)
    assert shown.console == []
    text = html.unescape(re.sub(r"<[^>]+>", "", shown.dom))
    for record in read_jsonl(transcript.parent / "train_rollouts.jsonl"):
        for turn in record["turns"]:
            assert turn["observation_text"] in text and turn["action_text"] in text
    assert len(re.findall(r"Group \d+/\d+ \(attempt 0\)", text)) == 2

    timeline = render(guess_run / "iteration_000000" / "timing_gantt.html")
    assert timeline.console == []
    assert "Step 0 timeline" in timeline.dom and ">trainer<" in timeline.dom and ">worker 0 rollout 0<" in timeline.dom
    assert timeline.dom.count('class="bar"') > 10
