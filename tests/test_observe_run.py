"""Seeing inside a whole run on FakeBackend, in virtual time: transcripts, the trace, the stall report, resumes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import read_jsonl
from tests.observe_helpers import complete_spans, thread_names
from tests.pipeline_helpers import RUN_DEADLINE_S, make_config, run_fake
from trio_rl import KLReferenceConfig, RLTestSetEvaluator, train
from trio_rl.observe import datum_json, read_trace
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec


def _submitted(backend: FakeBackend) -> list[dict[str, Any]]:
    """Every Datum FakeBackend received in forward_backward, as a transcript records one (less its mask)."""
    return [datum_json(d) for call in backend.calls_of("forward_backward") for d in call.detail["datums"]]


def _rollouts(log_path: Path) -> list[dict[str, Any]]:
    """Every rollout record of the run's transcripts, in step order."""
    return [r for p in sorted(log_path.glob("iteration_*/train_rollouts.jsonl")) for r in read_jsonl(p)]


def _names(log_path: Path, pattern: str) -> list[str]:
    return sorted(p.name for p in log_path.glob(pattern))


def _trained_in_transcripts(log_path: Path) -> list[dict[str, Any]]:
    data = []
    for path in sorted(log_path.glob("iteration_*/train_rollouts.jsonl")):
        for record in read_jsonl(path):
            if record["trained"]:
                for datum in record["data"]:
                    datum["loss_fn_inputs"].pop("mask")
                    data.append(datum)
    return data


@pytest.mark.parametrize(
    ("mode", "kl"),
    [("sync", {}), ("oldest_first", {}), ("sync", {"kl_penalty_coef": 0.5})],
    ids=["sync", "oldest_first", "sync-kl-penalty"],
)
async def test_transcripts_hold_exactly_the_datums_the_backend_trained(
    tmp_path: Path, mode: str, kl: dict[str, float], autojump_clock: object
) -> None:
    # With a KL penalty the trainer changes the advantages after the worker captured the
    # group: the transcript must still hold what was trained.
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    reference = {"kl_reference_config": KLReferenceConfig("trio-rl-tiny")} if kl else {}
    config = make_config(tmp_path, mode, transcripts_every=1, transcript_groups=100, **kl, **reference)
    result = await run_fake(config, FakeDataset(3, 4, FakeEnvSpec(group_size=2, turns=2)), backend)
    assert result.final_step == 3
    key = lambda d: json.dumps(d, sort_keys=True)  # noqa: E731
    assert sorted(map(key, _trained_in_transcripts(tmp_path))) == sorted(map(key, _submitted(backend)))
    steps = [r["step"] for r in _rollouts(tmp_path)]
    assert sorted(set(steps)) == [0, 1, 2]
    record = read_jsonl(tmp_path / "iteration_000000" / "train_rollouts.jsonl")[0]
    assert len(record["turns"]) == 2 and record["turns"][1]["observation"][:3] == record["turns"][0]["observation"]
    assert record["turns"][0]["metrics"] == {"even_frac": pytest.approx(record["turns"][0]["reward"] * 2)}
    page = (tmp_path / "iteration_000000" / "train_transcript.html").read_text()
    assert f"Group {record['batch']}/{record['group']}" in page


async def test_transcripts_every_n_steps_with_n_groups(tmp_path: Path, autojump_clock: object) -> None:
    config = make_config(tmp_path, "sync", transcripts_every=2, transcript_groups=3)
    await run_fake(config, FakeDataset(5, 4, FakeEnvSpec(group_size=2)))
    assert _names(tmp_path, "iteration_*") == [
        "iteration_000000",
        "iteration_000002",
        "iteration_000004",
    ]
    records = read_jsonl(tmp_path / "iteration_000002" / "train_rollouts.jsonl")
    assert len({(r["batch"], r["group"]) for r in records}) == 3 and len(records) == 6


async def test_the_trace_has_closed_nested_spans_and_each_rollout_covers_its_samples(
    tmp_path: Path, autojump_clock: object
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    config = make_config(tmp_path, "oldest_first", trace=True, save_every=2, timeline_every=1)
    await run_fake(config, FakeDataset(3, 4, FakeEnvSpec(group_size=3, turns=2, step_latency=0.25)), backend)
    events = read_trace(tmp_path / "trace_from_step_000000.json")
    spans = complete_spans(events)  # closed and nested on every track
    names = thread_names(events)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for track in spans.values():
        for s in track:
            by_name.setdefault(s["name"], []).append(s)
    assert len(by_name["sample"]) == len(backend.calls_of("sample"))
    assert len(by_name["forward_backward"]) == len(backend.calls_of("forward_backward"))
    # Three steps, and a fourth that waited for groups until the data ended.
    assert len(by_name["train_step"]) == 4 and len(by_name["trajectory_group_worker"]) == 12
    assert len(by_name["env_step"]) == 12 * 3 * 2
    for name in ("optim_step", "save_weights_for_sampler", "save_checkpoint", "wait_for_groups", "rollout"):
        assert by_name[name], name
    for tid, track in spans.items():
        rollouts = [s for s in track if s["name"] == "rollout"]
        for sample in (s for s in track if s["name"] == "sample"):
            assert any(
                r["ts"] <= sample["ts"] and sample["ts"] + sample["dur"] <= r["ts"] + r["dur"] for r in rollouts
            ), (
                names[tid],
                sample,
            )
    assert {names[t] for t in spans} >= {"trainer", "dataloader", "worker 0", "worker 0 rollout 0"}
    metrics = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "progress/groups" in r]
    # Each step's window holds the spans that closed in it, under the cookbook's names.
    assert all("time/forward_backward" in r and "time/optim_step" in r for r in metrics)
    samples = sum(r.get("time/sample:count", 1 if "time/sample" in r else 0) for r in metrics)
    assert 0 < samples <= len(backend.calls_of("sample"))
    assert (tmp_path / "iteration_000001" / "timing_gantt.html").read_text().count('class="label"') > 3


async def test_a_run_stuck_on_an_env_reports_that_group_within_the_stall_time(
    tmp_path: Path, autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    reports: list[tuple[float, str]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            reports.append((trio.current_time(), record.getMessage()))

    handler = Capture(logging.WARNING)
    logging.getLogger("trio_rl.observe").addHandler(handler)
    spec = FakeEnvSpec(group_size=2, hang_at={(0, 1)})
    config = make_config(tmp_path, "sync", stall_warning_s=30.0)
    start = trio.current_time()
    try:
        async with FakeBackend(sample_latency=1.0, train_latency=0.5) as backend:
            with trio.move_on_after(75):
                await train(config, dataset=FakeDataset(2, 4, spec), backend=backend)
    finally:
        logging.getLogger("trio_rl.observe").removeHandler(handler)
    assert [round(t - start) for t, _ in reports] == [30, 60]
    report = reports[0][1]
    line = next(line for line in report.splitlines() if line.startswith("  group 0/1:"))
    assert "attempt 0" in line and "env_step" in line
    assert "trainer: waiting on 1 x train_step, 1 x wait_for_groups" in report
    assert "Trio task tree:" in report and "rollout_worker" in report


@pytest.mark.parametrize("ending", ["cancelled", "crashed"])
async def test_a_cancelled_or_crashed_run_leaves_whole_trace_and_transcripts(
    tmp_path: Path, ending: str, autojump_clock: object
) -> None:
    spec = FakeEnvSpec(group_size=2, turns=2, fail_at={(2, 1): "step"} if ending == "crashed" else {})
    config = make_config(tmp_path, "oldest_first", trace=True, transcripts_every=1)
    async with FakeBackend(sample_latency=1.0, train_latency=0.5) as backend:
        with trio.fail_after(RUN_DEADLINE_S):
            if ending == "crashed":
                with pytest.RaisesGroup(RuntimeError, flatten_subgroups=True):
                    await train(config, dataset=FakeDataset(4, 4, spec), backend=backend)
            else:
                with trio.move_on_after(5.2):
                    await train(config, dataset=FakeDataset(4, 4, spec), backend=backend)
    events = read_trace(tmp_path / "trace_from_step_000000.json")
    spans = complete_spans(events)
    assert sum(len(t) for t in spans.values()) > 10
    assert _names(tmp_path, "iteration_*/train_rollouts.jsonl") and _rollouts(tmp_path)
    assert not _names(tmp_path, "**/*.tmp")


async def test_a_resumed_run_adds_its_steps_transcripts_and_a_trace_of_its_own(
    tmp_path: Path, autojump_clock: object
) -> None:
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    first = make_config(tmp_path, "sync", transcripts_every=1, trace=True, save_every=1, max_steps=2)
    await run_fake(first, FakeDataset(4, 4, FakeEnvSpec(group_size=2)), backend)
    before = (tmp_path / "iteration_000001" / "train_rollouts.jsonl").read_text()
    again = make_config(tmp_path, "sync", transcripts_every=1, trace=True, save_every=1, resume=True)
    await run_fake(again, FakeDataset(4, 4, FakeEnvSpec(group_size=2)), backend)
    steps = [r["step"] for r in _rollouts(tmp_path)]
    assert steps == [s for s in range(4) for _ in range(4 * 2)]
    assert (tmp_path / "iteration_000001" / "train_rollouts.jsonl").read_text() == before
    assert _names(tmp_path, "trace_*.json") == [
        "trace_from_step_000000.json",
        "trace_from_step_000002.json",
    ]
    for name in _names(tmp_path, "trace_*.json"):
        complete_spans(read_trace(tmp_path / name))


async def test_evaluations_are_transcribed_under_the_step_they_evaluated(
    tmp_path: Path, autojump_clock: object
) -> None:
    held_out = FakeDataset(1, 3, FakeEnvSpec(group_size=2))
    config = make_config(tmp_path, "sync", transcripts_every=1, transcript_groups=2, eval_every=2)
    await run_fake(config, FakeDataset(3, 4, FakeEnvSpec(group_size=2)), evaluators=(RLTestSetEvaluator(held_out, 4),))
    # Evaluated: the weights of steps 0 and 2 (eval_every) and the final weights, step 3.
    assert _names(tmp_path, "iteration_*/test_rollouts.jsonl") == ["test_rollouts.jsonl"] * 3
    for step in (0, 2, 3):
        records = read_jsonl(tmp_path / f"iteration_{step:06d}" / "test_rollouts.jsonl")
        assert [(r["group"], r["trajectory"], r["sampled_version"]) for r in records] == [
            (0, 0, step),
            (0, 1, step),
            (1, 0, step),
            (1, 1, step),
        ]
        assert all(r["split"] == "test" and not r["trained"] and r["data"] == [] for r in records)
