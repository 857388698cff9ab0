"""trio_rl.sinks: every sink gets the records of metrics.jsonl, in step order, and writes them for real."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.conftest import load_example, read_jsonl
from trio_rl.errors import ConfigError
from trio_rl.sinks import JsonlSink, MetricsSink, TensorBoardSink, WandbSink, close_sinks, open_sinks, scalars

RECORDS: list[dict[str, Any]] = [
    {"step": 0, "env/all/reward/total": 0.25, "progress/groups": 4, "eval/accuracy": 0.5, "note": "text"},
    {"step": 1, "env/all/reward/total": 0.75, "progress/groups": 4, "optim/kl": math.nan},
    {"step": 2, "run/final_step": 2, "eval/accuracy": 1.0, "flag": True},
]


def tensorboard_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under ``log_dir``, read back with TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The ``history`` rows of an offline run's ``.wandb`` file (LevelDB log framing of protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]  # generated protobuf code, no stubs
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                )
    return rows


S = TypeVar("S", bound=MetricsSink)


def feed(sink: S) -> S:
    """Write every record of RECORDS to ``sink``, in order, and close it."""
    for record in RECORDS:
        sink.write(record)
    sink.close()
    return sink


def test_scalars_are_the_finite_numbers_but_the_step() -> None:
    assert scalars(RECORDS[1]) == {"env/all/reward/total": 0.75, "progress/groups": 4.0}
    assert scalars(RECORDS[2]) == {"run/final_step": 2.0, "eval/accuracy": 1.0}


def test_jsonl_sink_writes_strict_json_lines(tmp_path: Path) -> None:
    feed(JsonlSink(tmp_path / "metrics.jsonl"))
    lines = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in lines] == [0, 1, 2] and lines[1]["optim/kl"] is None and lines[0]["note"] == "text"


def test_tensorboard_sink_writes_an_event_file_tensorboard_reads(tmp_path: Path) -> None:
    feed(TensorBoardSink(tmp_path / "tb"))
    read = tensorboard_scalars(tmp_path / "tb")
    assert read["env/all/reward/total"] == [(0, 0.25), (1, 0.75)]
    assert read["eval/accuracy"] == [(0, 0.5), (2, 1.0)]
    assert "optim/kl" not in read and "note" not in read


def test_wandb_sink_offline_writes_its_run_without_a_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens there: any upload would fail
    sink = feed(WandbSink(tmp_path, project="trio_rl-tests", mode="offline", config={"seed": 3}))
    assert sink.run_dir.parent == tmp_path / "wandb" and sink.run_dir.name.startswith("offline-run-")
    rows = wandb_history(sink.run_dir)
    assert [row["step"] for row in rows] == [0, 1, 2]
    assert rows[0]["env/all/reward/total"] == 0.25 and rows[1]["env/all/reward/total"] == 0.75
    assert rows[2]["eval/accuracy"] == 1.0 and "optim/kl" not in rows[1]


def test_a_sink_without_its_extra_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"trio_rl\[tensorboard\]"):
        open_sinks(["tensorboard"], tmp_path, config={})


def test_close_sinks_closes_every_sink_and_raises_the_first_failure() -> None:
    closed: list[str] = []

    class Sink:
        def __init__(self, name: str, fails: bool) -> None:
            self.name, self.fails = name, fails

        def write(self, record: Any) -> None: ...

        def close(self) -> None:
            closed.append(self.name)
            if self.fails:
                raise OSError(self.name)

    with pytest.raises(OSError, match="a"):
        close_sinks([Sink("a", True), Sink("b", True), Sink("c", False)])
    assert closed == ["a", "b", "c"]


def test_log_to_feeds_every_sink_the_records_of_metrics_jsonl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    arithmetic = load_example("arithmetic")
    argv = ["--log-path", str(tmp_path), "--max-steps", "4", "--groups-per-batch", "2", "--group-size", "2"]
    argv += ["--eval-every", "2", "--log-to", "tensorboard", "wandb", "--no-progress"]
    assert arithmetic.main(argv, d_model=16, n_layers=1, n_heads=2) == 0
    records = read_jsonl(tmp_path / "metrics.jsonl")
    # Training steps 0-3, the evaluations of the weights of steps 0, 2 and 4 as lines of their own, the final record.
    assert sorted({r["step"] for r in records}) == [0, 1, 2, 3, 4]
    assert sum("eval/accuracy" in r for r in records) == 3 and sum("progress/groups" in r for r in records) == 4

    read = tensorboard_scalars(tmp_path / "tensorboard")
    for key in ("env/all/reward/total", "eval/accuracy", "run/final_step"):
        want = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        assert want and read[key] == [(step, pytest.approx(value)) for step, value in want]  # type: ignore[comparison-overlap]

    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    rows = wandb_history(run_dir)
    # One W&B row per record, in the order of metrics.jsonl, each with its step.
    assert [row["_step"] for row in rows] == list(range(len(records)))
    for row, record in zip(rows, records, strict=True):
        assert {k: v for k, v in row.items() if not k.startswith("_")} == pytest.approx(
            {"step": record["step"], **scalars(record)}
        )
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["max_steps"] == 4
