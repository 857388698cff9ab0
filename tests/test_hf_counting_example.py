"""examples/smollm2_counting.py runs end to end (two async steps) on the tiny model given a chat template."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import tests.hf_helpers  # noqa: F401  (skips without the extra)
from tests.conftest import read_jsonl
from tests.integration.tiny_model import TinyModel
from tests.test_hf_example import CHATML, EXAMPLES


def test_the_counting_example_runs_two_async_steps_on_a_tiny_chat_model(tmp_path: Path, tiny_model: TinyModel) -> None:
    from transformers import AutoTokenizer

    model_dir = tmp_path / "models" / "tiny-chat"
    shutil.copytree(tiny_model.path, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(str(model_dir))
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    example = importlib.import_module("smollm2_counting")
    log_path = tmp_path / "run"
    argv = ["--model", str(model_dir), "--log-path", str(log_path), "--max-steps", "2", "--eval-every", "1"]
    argv += ["--num-threads", "1", "--no-progress", "--max-tokens", "8", "--eval-problems", "2"]
    assert example.main(argv) == 0
    records = read_jsonl(log_path / "metrics.jsonl")
    steps = [r for r in records if "env/all/reward/total" in r]
    assert [r["step"] for r in steps] == [0, 1]
    assert all(0.0 <= r["env/all/reward/total"] <= 1.0 for r in steps)
    assert any("eval/reward" in r for r in records)
