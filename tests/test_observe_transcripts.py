"""Transcript capture and files: every turn, rewards, advantages, logs, token versions and Datums."""

from __future__ import annotations

import json
from pathlib import Path

from tinker import types as tinker_types

from trio_rl import _tinker_compat as compat
from trio_rl.observe import GroupTranscript, TranscriptWriter, datum_json, token_ids
from trio_rl.rl.data import compute_advantages, trajectory_to_data
from trio_rl.types import TokensWithLogprobs, Trajectory, TrajectoryGroup, Transition


def _two_turn_group() -> TrajectoryGroup:
    def turn(ob: list[int], ac: list[int], reward: float, done: bool, versions: list[int] | None) -> Transition:
        action = TokensWithLogprobs(ac, [-0.5] * len(ac), "stop", token_versions=versions)
        return Transition(compat.model_input_from_ints(ob), action, reward, done, {"m": 1}, {"guess": ac[0]})

    first = Trajectory(
        [turn([1, 2], [3], 0.0, False, [0]), turn([1, 2, 3, 4], [5, 6], 1.0, True, [0, 1])],
        final_ob=compat.model_input_from_ints([]),
    )
    second = Trajectory([turn([1, 2], [7], 0.0, True, None)], final_ob=compat.model_input_from_ints([]))
    return TrajectoryGroup([first, second], [0.5, 0.0], [{}, {}])


def _capture() -> tuple[GroupTranscript, list[list[tinker_types.Datum]]]:
    group = _two_turn_group()
    (advantages,) = compute_advantages([group])
    data = [trajectory_to_data(t, a) for t, a in zip(group.trajectories_G, advantages, strict=True)]
    return GroupTranscript.of((3, 1, 0), 2, group, advantages, data, ["fake"]), data


def test_capture_keeps_every_turn_reward_advantage_log_and_token_version() -> None:
    transcript, data = _capture()
    first, second = transcript.trajectories
    assert [t.action for t in first.turns] == [[3], [5, 6]]
    assert [t.observation for t in first.turns] == [[1, 2], [1, 2, 3, 4]]
    assert [t.logs for t in first.turns] == [{"guess": 3}, {"guess": 5}]
    assert first.turns[1].token_versions == [0, 1] and second.turns[0].token_versions is None
    assert (first.total_reward, second.total_reward) == (1.5, 0.0)
    assert (first.advantage, second.advantage) == (0.75, -0.75)
    assert first.data == [datum_json(d) for d in data[0]]


def test_the_writer_writes_a_page_and_one_record_per_trajectory(tmp_path: Path) -> None:
    transcript, _ = _capture()
    page = TranscriptWriter(tmp_path, token_ids).write("train", 7, [(transcript, True)])
    assert page == tmp_path / "iteration_000007" / "train_transcript.html"
    text = page.read_text()
    assert "Group 3/1" in text and "1 2 3 4" in text and "guess" in text and "v0: 1 tokens, v1: 1 tokens" in text
    records = [json.loads(line) for line in (page.parent / "train_rollouts.jsonl").read_text().splitlines()]
    assert [(r["step"], r["batch"], r["group"], r["trajectory"]) for r in records] == [(7, 3, 1, 0), (7, 3, 1, 1)]
    assert records[0]["turns"][1]["action_text"] == "5 6"
    assert records[0]["advantage"] == 0.75 and records[0]["trained"] is True


def test_writing_a_step_again_replaces_its_files_rather_than_adding_to_them(tmp_path: Path) -> None:
    transcript, _ = _capture()
    writer = TranscriptWriter(tmp_path, token_ids)
    writer.write("train", 0, [(transcript, True)])
    writer.write("train", 1, [(transcript, True)])
    writer.write("train", 1, [(transcript, False)])
    lines = (tmp_path / "iteration_000001" / "train_rollouts.jsonl").read_text().splitlines()
    assert [json.loads(line)["trained"] for line in lines] == [False, False]
    assert (tmp_path / "iteration_000000" / "train_rollouts.jsonl").exists()
    assert not list(tmp_path.rglob("*.tmp"))


def test_text_is_escaped_in_the_page(tmp_path: Path) -> None:
    transcript, _ = _capture()
    page = TranscriptWriter(tmp_path, lambda tokens: "<script>x</script>").write("train", 0, [(transcript, True)])
    assert "<script>" not in page.read_text() and "&lt;script&gt;" in page.read_text()
