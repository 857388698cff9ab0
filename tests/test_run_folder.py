"""A run folder belongs to one run, and resume copes with what a crash can leave in it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trio.testing import MockClock

from tests.conftest import read_jsonl
from tests.pipeline_helpers import make_config, run_fake
from trio_rl import CheckpointLog, ConfigError
from trio_rl.base.jsonl import DamagedFileError, RunFolderWarning, read_records
from trio_rl.errors import DatasetTooShortError
from trio_rl.loop.checkpoints import CheckpointRecord
from trio_rl.loop.run_folder import ResumeError, RunFolderExistsError
from trio_rl.sinks import JsonlSink
from trio_rl.testing import FakeBackend, FakeDataset


async def test_a_second_run_in_the_same_folder_is_refused_naming_the_choices(
    log_path: Path, autojump_clock: MockClock
) -> None:
    await run_fake(make_config(log_path, "sync"), FakeDataset(3, 4))
    before = (log_path / "metrics.jsonl").read_text()
    with pytest.raises(RunFolderExistsError, match=r"already holds a run .*resume.*another log_path.*overwrite"):
        await run_fake(make_config(log_path, "sync"), FakeDataset(3, 4))
    assert isinstance(RunFolderExistsError("log_path", "x"), ConfigError)
    # Refused before any work: nothing was appended or overwritten.
    assert (log_path / "metrics.jsonl").read_text() == before


async def test_overwrite_replaces_the_run(log_path: Path, autojump_clock: MockClock) -> None:
    await run_fake(make_config(log_path, "sync"), FakeDataset(3, 4))
    await run_fake(make_config(log_path, "sync", overwrite=True), FakeDataset(2, 4))
    assert [r["step"] for r in read_jsonl(log_path / "metrics.jsonl")] == [0, 1, 2]
    assert [c.step for c in CheckpointLog(log_path).all()] == [2]


async def test_resume_before_the_first_checkpoint_starts_again_without_duplicates(
    log_path: Path, autojump_clock: MockClock
) -> None:
    # A first run that wrote records but was killed before any checkpoint.
    await run_fake(make_config(log_path, "sync"), FakeDataset(2, 4))
    (log_path / "checkpoints.jsonl").unlink()
    result = await run_fake(make_config(log_path, "sync", resume=True), FakeDataset(3, 4))
    assert result.step_metrics[0]["step"] == 0
    assert [r["step"] for r in read_jsonl(log_path / "metrics.jsonl")] == [0, 1, 2, 3]


@pytest.mark.parametrize("torn", ["metrics.jsonl", "checkpoints.jsonl"])
async def test_a_torn_last_line_is_ignored_with_a_warning(log_path: Path, torn: str, autojump_clock: MockClock) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    await run_fake(make_config(log_path, "sync", max_steps=2, save_every=1), FakeDataset(5, 4), backend)
    with (log_path / torn).open("a") as f:
        f.write('{"step": 2, "env/all/rew')  # a kill in the middle of an append
    with pytest.warns(RunFolderWarning, match=f"{torn}: ignoring its torn last line"):
        result = await run_fake(make_config(log_path, "sync", resume=True), FakeDataset(5, 4), backend)
    assert result.step_metrics[0]["step"] == 2
    # Every line of both files is whole again, one training record per step.
    steps = [r["step"] for r in read_jsonl(log_path / "metrics.jsonl") if "progress/groups" in r]
    assert steps == [0, 1, 2, 3, 4]
    read_jsonl(log_path / "checkpoints.jsonl")


async def test_a_newest_checkpoint_that_does_not_load_falls_back_to_the_one_before(
    log_path: Path, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    await run_fake(make_config(log_path, "sync", max_steps=3, save_every=1), FakeDataset(6, 4), backend)
    newest = CheckpointLog(log_path).last()
    assert newest is not None and newest.step == 3
    del backend.states[newest.state_path]  # its files are gone
    with pytest.warns(RunFolderWarning) as caught:
        result = await run_fake(make_config(log_path, "sync", resume=True), FakeDataset(6, 4), backend)
    # The final row and the periodic one of step 3 name the same state: both are skipped.
    assert [str(w.message).split(": ", 1)[1].split(" (")[0] for w in caught] == [
        "checkpoint final",
        "checkpoint 000003",
    ]
    assert result.step_metrics[0]["step"] == 2
    steps = [r["step"] for r in read_jsonl(log_path / "metrics.jsonl") if "progress/groups" in r]
    assert steps == list(range(6))


async def test_no_loadable_checkpoint_is_an_error_naming_the_file(log_path: Path, autojump_clock: MockClock) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    await run_fake(make_config(log_path, "sync"), FakeDataset(2, 4), backend)
    backend.states.clear()
    with (
        pytest.warns(RunFolderWarning),
        pytest.RaisesGroup(pytest.RaisesExc(ResumeError, match=r"checkpoints\.jsonl loads .*overwrite")),
    ):
        await run_fake(make_config(log_path, "sync", resume=True), FakeDataset(2, 4), backend)


async def test_a_damaged_middle_line_names_the_file_and_line(log_path: Path, autojump_clock: MockClock) -> None:
    await run_fake(make_config(log_path, "sync", save_every=1), FakeDataset(3, 4))
    path = log_path / "checkpoints.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:10]
    path.write_text("\n".join(lines) + "\n")
    with pytest.RaisesGroup(pytest.RaisesExc(DamagedFileError, match=r"checkpoints\.jsonl, line 2: ")):
        await run_fake(make_config(log_path, "sync", resume=True), FakeDataset(3, 4))
    json.loads(lines[0])


@pytest.mark.parametrize("mode", ["sync", "pace"])
async def test_a_checkpoint_row_without_its_newline_gets_one_before_the_next_row(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    await run_fake(make_config(log_path, mode, max_steps=2, save_every=2), FakeDataset(8, 4), backend)
    path = log_path / "checkpoints.jsonl"
    path.write_text(path.read_text().rstrip("\n"))  # an editor or a copy dropped the last newline
    await run_fake(make_config(log_path, mode, max_steps=4, save_every=2, resume=True), FakeDataset(8, 4), backend)
    # The rows written after it start lines of their own: the next resume reads
    # every row and continues from the newest state, not an older one.
    assert [c.step for c in CheckpointLog(log_path).all()] == [2, 2, 4, 4]
    result = await run_fake(make_config(log_path, mode, save_every=2, resume=True), FakeDataset(8, 4), backend)
    assert result.first_step == 4
    steps = [r["step"] for r in read_jsonl(log_path / "metrics.jsonl") if "progress/groups" in r]
    assert steps == list(range(8))


@pytest.mark.parametrize("writer", ["checkpoint log", "metrics sink"])
def test_an_append_never_glues_onto_a_last_line_without_its_newline(tmp_path: Path, writer: str) -> None:
    def append(path: Path, record: dict[str, object]) -> None:
        if writer == "checkpoint log":
            CheckpointLog(path.parent).append(
                CheckpointRecord(name="x", batch=int(str(record["step"])), state_path="s")
            )
        else:
            sink = JsonlSink(path)
            sink.write(record)
            sink.close()

    path = tmp_path / ("checkpoints.jsonl" if writer == "checkpoint log" else "metrics.jsonl")
    append(path, {"step": 1})
    path.write_text(path.read_text().rstrip("\n"))
    append(path, {"step": 2})
    assert [r["step"] for r in read_records(path)] == [1, 2]
    # A torn fragment is cut, with a warning, rather than turned into a damaged middle line.
    with path.open("a") as f:
        f.write('{"step": 3, "los')
    with pytest.warns(RunFolderWarning, match="cutting its torn last line"):
        append(path, {"step": 4})
    assert [r["step"] for r in read_records(path)] == [1, 2, 4]


@pytest.mark.parametrize("mode", ["sync", "requeue"])
async def test_resuming_with_a_dataset_shorter_than_the_checkpoint_fails_first_naming_both(
    log_path: Path, mode: str, autojump_clock: MockClock
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    await run_fake(make_config(log_path, mode, max_steps=5, save_every=1), FakeDataset(8, 4), backend)
    before = {name: (log_path / name).read_text() for name in ("metrics.jsonl", "checkpoints.jsonl", "config.json")}
    with pytest.raises(
        DatasetTooShortError,
        match=r"resume: checkpoint final \(step 5\) in .*checkpoints\.jsonl continues the dataset at batch \d, "
        r"group \d, but the dataset has 3 batches",
    ) as caught:
        await run_fake(make_config(log_path, mode, resume=True), FakeDataset(3, 4), backend)
    assert isinstance(caught.value, ConfigError) and caught.value.dataset_length == 3
    # Refused before anything was rewritten.
    assert {name: (log_path / name).read_text() for name in before} == before
    assert backend.calls_of("load_state") == []


async def test_resuming_a_finished_run_with_its_own_dataset_is_not_refused(
    log_path: Path, autojump_clock: MockClock
) -> None:
    # Its cursor is (len, 0): the dataset handed out to its end, which is not past it.
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    await run_fake(make_config(log_path, "sync"), FakeDataset(3, 4), backend)
    result = await run_fake(make_config(log_path, "sync", resume=True), FakeDataset(3, 4), backend)
    assert result.final_step == 3
