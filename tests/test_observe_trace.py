"""The trace writer and the span hook: closed, nested spans on named tracks, in virtual time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from tests.observe_helpers import assert_nested, complete_spans, thread_names
from trio_rl.observe import SpanRecord, TraceFile, Watch, on_track, read_trace, span, timing_metrics, watching


async def test_spans_are_written_as_complete_events_in_microseconds(tmp_path: Path, autojump_clock: object) -> None:
    path = tmp_path / "trace.json"
    trace = TraceFile(path, origin=trio.current_time())
    with watching(Watch(trace.write)), on_track("trainer"), span("train_step", step=3):
        await trio.sleep(1.5)
        with span("forward_backward"):
            await trio.sleep(0.25)
    trace.close()
    events = read_trace(path)
    spans = complete_spans(events)
    (tid,) = spans
    assert thread_names(events)[tid] == "trainer"
    by_name = {s["name"]: s for s in spans[tid]}
    assert by_name["train_step"]["ts"] == 0 and by_name["train_step"]["dur"] == pytest.approx(1.75e6)
    assert by_name["forward_backward"]["ts"] == pytest.approx(1.5e6)
    assert by_name["train_step"]["args"] == {"step": 3}


async def test_a_span_left_by_an_exception_or_a_cancellation_is_closed(tmp_path: Path, autojump_clock: object) -> None:
    path = tmp_path / "trace.json"
    trace = TraceFile(path, origin=trio.current_time())
    with watching(Watch(trace.write)):
        with pytest.raises(ValueError, match="boom"), span("env_step"):
            await trio.sleep(1)
            raise ValueError("boom")
        with trio.move_on_after(2), span("sample"):
            await trio.sleep_forever()
    trace.close()
    names = {e["name"]: e for e in read_trace(path) if e["ph"] == "X"}
    assert names["env_step"]["dur"] == pytest.approx(1e6)
    assert names["sample"]["dur"] == pytest.approx(2e6)


async def test_concurrent_tasks_on_their_own_tracks_nest_per_track(tmp_path: Path, autojump_clock: object) -> None:
    path = tmp_path / "trace.json"
    trace = TraceFile(path, origin=trio.current_time())

    async def rollout(index: int) -> None:
        with on_track(f"worker 0 env {index}"), span("rollout"):
            for turn in range(3):
                with span("sample", turn=turn):
                    await trio.sleep(0.1 * (index + 1))
                with span("env_step"):
                    await trio.sleep(0.05)

    with watching(Watch(trace.write)), on_track("worker 0"), span("trajectory_group_worker"):
        async with trio.open_nursery() as nursery:
            for index in range(4):
                nursery.start_soon(rollout, index)
    trace.close()
    events = read_trace(path)
    spans = complete_spans(events)
    names = thread_names(events)
    assert sorted(names[tid] for tid in spans) == ["worker 0", *(f"worker 0 env {i}" for i in range(4))]
    for tid, track in spans.items():
        if names[tid] == "worker 0":
            continue
        (rollout_span,) = [s for s in track if s["name"] == "rollout"]
        samples = [s for s in track if s["name"] == "sample"]
        assert len(samples) == 3
        for s in samples:
            assert rollout_span["ts"] <= s["ts"] and s["ts"] + s["dur"] <= rollout_span["ts"] + rollout_span["dur"]


def test_the_nesting_check_catches_overlapping_spans() -> None:
    with pytest.raises(AssertionError, match="overlaps"):
        assert_nested([{"ts": 0, "dur": 10}, {"ts": 5, "dur": 10}])


def test_a_closed_trace_is_whole_json_and_closing_twice_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    trace = TraceFile(path, origin=0.0)
    trace.write(SpanRecord("sample", "worker 1", 1.0, 2.0, {}))
    trace.close()
    trace.close()
    trace.write(SpanRecord("late", "worker 1", 3.0, 4.0, {}))
    parsed = json.loads(path.read_text())
    assert [e["name"] for e in parsed["traceEvents"]] == ["process_name", "thread_name", "sample"]


async def test_span_outside_a_watched_run_does_nothing() -> None:
    with span("sample"):
        await trio.lowlevel.checkpoint()
    with watching(Watch(None)), span("sample"):  # no trace, no activity: nothing recorded
        await trio.lowlevel.checkpoint()


def test_timing_metrics_follow_the_cookbooks_names() -> None:
    spans = [
        SpanRecord("train_step", "trainer", 0.0, 2.0, {}),
        SpanRecord("sample", "w", 0.0, 1.0, {}),
        SpanRecord("sample", "w", 1.0, 4.0, {}),
    ]
    assert timing_metrics(spans) == {
        "time/train_step": 2.0,
        "time/sample:total": 4.0,
        "time/sample:count": 2,
        "time/sample:mean": 2.0,
        "time/sample:max": 3.0,
    }
