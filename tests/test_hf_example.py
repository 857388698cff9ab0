"""examples/smollm2_addition.py runs end to end (two steps), on the tiny model given a chat template."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

from tests.conftest import load_example, read_jsonl
from tests.integration.tiny_model import TinyModel
from trio_rl import CheckpointLog

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_chat_example(tmp_path: Path, tiny_model: TinyModel, module: str) -> tuple[Path, ModuleType]:
    """A copy of the tiny model with a chat template, as a SmolLM2 example loads one, and the example ``module``."""
    from transformers import AutoTokenizer

    model_dir = tmp_path / "models" / "tiny-chat"
    shutil.copytree(tiny_model.path, model_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    tokenizer.chat_template = CHATML
    tokenizer.save_pretrained(str(model_dir))
    return model_dir, load_example(module)


def test_the_smollm2_example_runs_two_steps_on_a_tiny_chat_model(tmp_path: Path, tiny_model: TinyModel) -> None:
    model_dir, example = tiny_chat_example(tmp_path, tiny_model, "smollm2_addition")
    log_path = tmp_path / "run"
    code = example.main(
        [
            "--model",
            str(model_dir),
            "--log-path",
            str(log_path),
            "--max-steps",
            "2",
            "--eval-every",
            "1",
            "--num-threads",
            "1",
            "--no-progress",
        ],
    )
    assert code == 0
    records = read_jsonl(log_path / "metrics.jsonl")
    steps = [r for r in records if "env/all/reward/total" in r]
    assert [r["step"] for r in steps] == [0, 1]
    assert all("eval/accuracy" in r for r in records if r["step"] in (0, 1, 2) and "time/eval" in r)
    assert (log_path / "reward_curve.png").is_file()
    final = CheckpointLog(log_path).last()
    assert final is not None and final.step == 2
    assert (Path(final.state_path) / "adapter_config.json").is_file()
