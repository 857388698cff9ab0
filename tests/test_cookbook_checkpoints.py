"""checkpoints.jsonl rows in tinker-cookbook 0.6.1's format, and resuming from a cookbook run folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from trio.testing import MockClock

from tests.conftest import read_jsonl
from tests.pipeline_helpers import make_config, run_fake
from trio_rl.loop.checkpoints import CheckpointLog
from trio_rl.testing import FakeBackend, FakeDataset

COOKBOOK_FIELDS = ("name", "batch", "state_path", "sampler_path", "cumulative_tokens", "discarded_tokens")
TOKEN_KINDS = {"sampled", "prefill_cached", "prefill_uncached", "trained"}

COOKBOOK_ROW: dict[str, Any] = {
    "name": "000002",
    "batch": 2,
    "state_path": "tinker://fake-run/weights/000002",
    "sampler_path": "tinker://fake-run/sampler_weights/000002",
    "cumulative_tokens": {"sampled": 124, "prefill_cached": 0, "prefill_uncached": 2260, "trained": 2352},
    "discarded_tokens": {"sampled": 0, "prefill_cached": 0, "prefill_uncached": 0, "trained": 0},
}
"""A row the cookbook wrote (async run, fake clients), as measured."""


async def test_rows_carry_the_cookbook_fields_then_trio_rls(log_path: Path, autojump_clock: MockClock) -> None:
    await run_fake(make_config(log_path, "sync", save_every=2), FakeDataset(3, 2))
    rows = read_jsonl(log_path / "checkpoints.jsonl")
    assert [r["name"] for r in rows] == ["000002", "final"]
    assert [r["batch"] for r in rows] == [2, 3]
    for row in rows:
        assert tuple(row)[:6] == COOKBOOK_FIELDS
        assert set(row) - set(COOKBOOK_FIELDS) == {
            "step",
            "cursor",
            "outstanding",
            "final",
            "reason",
            "counts",
            "owed_evaluations",
        }
        assert set(row["cumulative_tokens"]) == set(row["discarded_tokens"]) == TOKEN_KINDS
        assert row["sampler_path"] == f"fake://sampler/{row['batch']:06d}"
    # The totals are those of the metrics at the same step.
    last_step = [r for r in read_jsonl(log_path / "metrics.jsonl") if "progress/groups" in r][-1]
    assert rows[-1]["cumulative_tokens"] == {k: last_step[f"tokens/cumulative/{k}"] for k in TOKEN_KINDS}
    assert rows[-1]["cumulative_tokens"]["trained"] > 0


@pytest.fixture
def cookbook_run_folder(log_path: Path) -> Path:
    """A run folder whose only checkpoint row is :data:`COOKBOOK_ROW`, written before the test's Trio run."""
    log_path.mkdir(parents=True)
    (log_path / "checkpoints.jsonl").write_text(json.dumps(COOKBOOK_ROW) + "\n")
    return log_path


async def test_a_cookbook_run_folder_resumes_at_its_batch_with_its_token_totals(
    cookbook_run_folder: Path, autojump_clock: MockClock
) -> None:
    log_path = cookbook_run_folder
    checkpoint = CheckpointLog(log_path).last()
    assert (
        checkpoint is not None and checkpoint.step == 2 and checkpoint.cursor == (2, 0) and checkpoint.outstanding == []
    )
    backend = FakeBackend(sample_latency=1.0, train_latency=0.5)
    backend.states[COOKBOOK_ROW["state_path"]] = 2  # the state the cookbook saved
    dataset = FakeDataset(4, 2)
    result = await run_fake(make_config(log_path, "sync", resume=True), dataset, backend)
    assert [m["step"] for m in result.step_metrics] == [2, 3]
    assert {line.split(" ", 1)[1] for line in dataset.log if line.startswith("make_envs")} == {
        str((b, g)) for b in (2, 3) for g in (0, 1)
    }
    first = result.step_metrics[0]
    assert first["tokens/cumulative/trained"] == 2352 + first["tokens/trained"]
