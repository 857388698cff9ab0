"""trio_rl.cli: flags, configs, and Ctrl-C on a real run in a subprocess."""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import read_jsonl
from trio_rl import AsyncConfig, Config
from trio_rl.cli import EXIT_CONFIG_ERROR, EXIT_INTERRUPTED, CommonArgs, Reporting, make_config, parse_args, run_cli
from trio_rl.loop.checkpoints import CheckpointLog

ROOT = Path(__file__).resolve().parent.parent


EXAMPLE_CONFIG = Config(log_path="runs/test", max_steps=7, save_on_cancel=True)


@dataclass
class ExampleArgs(CommonArgs):
    config: Config = EXAMPLE_CONFIG
    depth: int = 3
    """an example's own flag"""


def test_flags_come_from_the_dataclass_and_overrides_only_change_defaults() -> None:
    args = parse_args(ExampleArgs, [])
    assert args.config == EXAMPLE_CONFIG and args.depth == 3 and args.progress is True
    args = parse_args(ExampleArgs, ["--depth", "5", "--no-progress", "--learning-rate", "0.5"], max_steps=2)
    assert args.depth == 5 and args.progress is False
    assert args.config == dataclasses.replace(EXAMPLE_CONFIG, learning_rate=0.5, max_steps=2)
    assert parse_args(ExampleArgs, ["--max-steps", "9"], max_steps=2).config.max_steps == 9
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


@pytest.mark.parametrize(
    ("flags", "chosen", "trained"),
    [
        ([], None, ("importance_sampling", {"tis_cap": 2.0})),
        # Named on the command line, even as Config's default: plain importance sampling, no TIS.
        (["--loss-fn", "importance_sampling"], "importance_sampling", ("importance_sampling", None)),
        (["--loss_fn=ppo"], "ppo", ("ppo", None)),
        (["--loss-fn-config", "tis_cap", "3.0"], None, ("importance_sampling", {"tis_cap": 3.0})),
    ],
)
def test_an_async_run_trains_the_backends_default_unless_the_command_line_names_a_loss(
    tmp_path: Path, flags: list[str], chosen: str | None, trained: tuple[str, dict[str, float] | None]
) -> None:
    from trio_rl.async_loss import with_async_loss
    from trio_rl.backends.local import LocalBackend

    config = make_config(parse_args(ExampleArgs, ["--mode", "async", *flags]))
    assert config.async_config is not None and config.async_config.loss_fn == chosen
    resolved = with_async_loss(config, LocalBackend(log_dir=tmp_path))
    assert (resolved.training_loss_fn(), resolved.loss_fn_config) == trained


OWN_ASYNC = AsyncConfig(1, 8, loss_fn="cispo")


def test_an_async_run_trains_a_loss_the_example_chose() -> None:
    # An example's Config.loss_fn other than the default is a choice (in code it would conflict with None).
    assert make_config(parse_args(ExampleArgs, ["--mode", "async"], loss_fn="ppo")).training_loss_fn() == "ppo"

    @dataclass
    class OwnAsync(ExampleArgs):
        async_flags: AsyncConfig = OWN_ASYNC

    assert make_config(parse_args(OwnAsync, ["--mode", "async"])).training_loss_fn() == "cispo"
    assert make_config(parse_args(OwnAsync, ["--mode", "async", "--loss-fn", "dro"])).training_loss_fn() == "dro"


def test_only_flags_before_a_double_dash_count_as_given() -> None:
    from trio_rl.cli.flags import _flag_given

    assert _flag_given(["--seed", "1", "--loss-fn=ppo"], "loss_fn")
    assert not _flag_given(["--loss-fn-config", "tis_cap", "2"], "loss_fn")
    assert not _flag_given(["--", "--loss-fn", "ppo"], "loss_fn")


def test_an_unknown_mode_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parse_args(ExampleArgs, ["--mode", "turbo"])
    assert stop.value.code == EXIT_CONFIG_ERROR and "turbo" in capsys.readouterr().err


def test_a_config_error_raised_inside_the_run_prints_its_message(tmp_path: Path) -> None:
    # The stream minibatch size is checked against the dataset's batches only once
    # train() runs, inside nested nurseries: the error arrives twice wrapped.
    from trio_rl import Config, StreamMinibatchConfig
    from trio_rl.testing import FakeBackend, FakeDataset

    out = io.StringIO()
    config = Config(log_path=tmp_path, stream_minibatch_config=StreamMinibatchConfig(4, 2))
    code = run_cli(
        config, dataset=FakeDataset(num_batches=2, batch_size=2), backend=FakeBackend(), reporting=Reporting(out=out)
    )
    assert code == EXIT_CONFIG_ERROR
    assert out.getvalue() == (
        "error: stream_minibatch_config.groups_per_batch: is 4 but the dataset's batches hold 2 groups; make them equal\n"
    )


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


def test_the_last_line_reports_the_final_evaluation(tmp_path: Path) -> None:
    from trio_rl.testing import FakeBackend, FakeDataset, FakeEvaluator

    out = io.StringIO()
    config = Config(log_path=tmp_path, eval_every=0)
    code = run_cli(
        config,
        dataset=FakeDataset(3, 2),
        backend=FakeBackend(),
        evaluators=(FakeEvaluator(),),
        reporting=Reporting(curve_keys=("test/version",), progress=False, out=out),
    )
    assert code == 0
    # The final evaluation is a record of its own; the summary still finds it.
    assert "final test/version 3.000" in out.getvalue().splitlines()[-1]
