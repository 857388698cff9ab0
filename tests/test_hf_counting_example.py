"""examples/smollm2_counting.py runs end to end (two async steps) on the tiny model given a chat template."""

from __future__ import annotations

from pathlib import Path

import tests.hf_helpers  # noqa: F401  (skips without the extra)
from tests.conftest import read_jsonl
from tests.integration.tiny_model import TinyModel
from tests.test_hf_example import tiny_chat_example


def test_the_counting_example_runs_two_async_steps_on_a_tiny_chat_model(tmp_path: Path, tiny_model: TinyModel) -> None:
    model_dir, example = tiny_chat_example(tmp_path, tiny_model, "smollm2_counting")
    log_path = tmp_path / "run"
    argv = ["--model", str(model_dir), "--log-path", str(log_path), "--max-steps", "2", "--eval-every", "1"]
    argv += ["--num-threads", "1", "--no-progress", "--max-tokens", "8", "--eval-problems", "2"]
    assert example.main(argv) == 0
    records = read_jsonl(log_path / "metrics.jsonl")
    steps = [r for r in records if "env/all/reward/total" in r]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(0.0 <= r["env/all/reward/total"] <= 1.0 for r in steps)
    assert any("eval/reward" in r for r in records)
