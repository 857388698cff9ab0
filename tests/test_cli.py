"""trio_rl.cli: flags, configs, and Ctrl-C on a real run in a subprocess."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import read_jsonl
from trio_rl.checkpoint import CheckpointLog
from trio_rl.cli import EXIT_INTERRUPTED, CommonArgs, flag, make_config, parse_args
from trio_rl.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ExampleArgs(CommonArgs):
    max_steps: int = 7
    depth: int = flag(3, "an example's own flag")


def test_flags_come_from_the_dataclass_and_overrides_only_change_defaults() -> None:
    args = parse_args(ExampleArgs, [])
    assert args.max_steps == 7 and args.depth == 3 and args.progress is True and args.model is None
    args = parse_args(ExampleArgs, ["--depth", "5", "--no-progress", "--learning-rate", "0.5"], max_steps=2)
    assert args.depth == 5 and args.progress is False and args.learning_rate == 0.5 and args.max_steps == 2
    assert parse_args(ExampleArgs, ["--max-steps", "9"], max_steps=2).max_steps == 9
    with pytest.raises(TypeError):
        parse_args(ExampleArgs, [], no_such_field=1)


@pytest.mark.parametrize("mode", ["sync", "stream", "async"])
def test_make_config_selects_the_mode(mode: str) -> None:
    args = parse_args(ExampleArgs, ["--mode", mode, "--staleness", "pace", "--max-steps-off-policy", "3"])
    config = make_config(args)
    assert config.mode == mode and config.save_on_cancel
    if mode == "async":
        assert config.async_config is not None
        assert (config.async_config.staleness, config.async_config.max_steps_off_policy) == ("pace", 3)


def test_an_unknown_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="mode"):
        make_config(parse_args(ExampleArgs, ["--mode", "turbo"]))


def test_ctrl_c_saves_the_last_step_and_exits_130(tmp_path: Path) -> None:
    log_path = tmp_path / "run"
    command = [
        sys.executable,
        str(ROOT / "examples" / "arithmetic.py"),
        "--log-path", str(log_path),
        "--max-steps", "100000",
        "--save-every", "0",
        "--d-model", "16", "--n-layers", "1", "--n-heads", "2",
        "--groups-per-batch", "4", "--group-size", "4",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 60
        metrics = log_path / "metrics.jsonl"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never got going"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err and "Traceback" not in out
    checkpoint = CheckpointLog(log_path).last()
    assert checkpoint is not None and checkpoint.reason == "cancelled"
    last_line = err.strip().splitlines()[-1]
    assert last_line == (
        f"stopped after {last_line.split()[2]} checkpoint of step {checkpoint.step} at {checkpoint.state_path} "
        "(resume with --resume)"
    )
    assert Path(checkpoint.state_path, "weights.safetensors").exists()
    # Every step recorded before the stop is covered by the checkpoint.
    assert checkpoint.step >= len([r for r in read_jsonl(log_path / "metrics.jsonl") if "progress/groups" in r])
    assert (log_path / "reward_curve.png").exists()
