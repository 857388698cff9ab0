"""Ctrl-C, SIGTERM and kill -9 on a real run of the main example, in a subprocess.

Whatever the moment, the run ends with the last completed step saved once, one
line saying so, and the documented exit code; a run killed outright resumes with
every step trained exactly once.
"""

from __future__ import annotations

import ast
import io
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import read_jsonl
from trio_rl import CheckpointLog, Config
from trio_rl.cli import ERROR_LOG, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED, Reporting, run_cli
from trio_rl.testing import FakeBackend, FakeDataset

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--groups-per-batch", "4", "--group-size", "4"]


def example(log_path: Path, *flags: str) -> list[str]:
    return [sys.executable, str(ROOT / "examples" / "arithmetic.py"), "--log-path", str(log_path), *TINY, *flags]


@contextmanager
def running(command: list[str]) -> Iterator[subprocess.Popen[str]]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def wait_for_steps(proc: subprocess.Popen[str], log_path: Path, steps: int, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    metrics = log_path / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text().count("progress/groups") >= steps):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never got going"
        time.sleep(0.02)


def training_steps(log_path: Path) -> list[int]:
    return [r["step"] for r in read_jsonl(log_path / "metrics.jsonl") if "progress/groups" in r]


def wait_for_its_signal_handlers(proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
    """Until the example has installed its start-up handlers (SIGTERM's is set right after SIGINT's).

    A Ctrl-C before that lands while Python itself starts, before any line of
    the example runs, where it can only end in Python's own traceback.
    """
    status = Path(f"/proc/{proc.pid}/status")
    if not status.exists():  # no procfs: the imports take far longer than this
        time.sleep(0.3)
        return
    deadline = time.monotonic() + timeout
    while True:
        caught = next(line for line in status.read_text().splitlines() if line.startswith("SigCgt:"))
        if int(caught.split()[1], 16) & (1 << (signal.SIGTERM - 1)):
            return
        assert proc.poll() is None and time.monotonic() < deadline, "the example never installed its handlers"
        time.sleep(0.005)


def test_ctrl_c_during_start_up_exits_130_without_a_traceback(tmp_path: Path) -> None:
    with running(example(tmp_path / "run", "--max-steps", "5")) as proc:
        wait_for_its_signal_handlers(proc)  # then still importing torch
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err + out


# A stop signal whose handler runs inside a weakref callback, where Python reports
# an exception as "ignored" and goes on, as it does inside the import machinery's
# module-lock callbacks while torch loads.
SIGNAL_IN_A_WEAKREF_CALLBACK = """
import os, signal, time, weakref
class Thing: pass
def callback(ref):
    os.kill(os.getpid(), {signum})
    time.sleep(5)
thing = Thing()
ref = weakref.ref(thing, callback)
del thing
print("the process went on")
"""


def start_up_handlers_of(example_name: str) -> str:
    """The source of an example's first ``if __name__ == "__main__":`` block, which sets its start-up handlers."""
    source = (ROOT / "examples" / f"{example_name}.py").read_text()
    block = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    )
    segment = ast.get_source_segment(source, block)
    assert segment is not None and "signal.SIGTERM" in segment
    return "import os, signal, sys\n" + segment


START_UP_HANDLERS = {
    "trio_rl.cli": "from trio_rl.cli import exit_quietly_on_stop_signals\nexit_quietly_on_stop_signals()",
    **{
        path.stem: start_up_handlers_of(path.stem)
        for path in sorted((ROOT / "examples").glob("*.py"))
        if "os._exit(130)" in path.read_text() or "sys.exit(130)" in path.read_text()
    },
}


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, EXIT_TERMINATED)])
@pytest.mark.parametrize("installer", sorted(START_UP_HANDLERS))
def test_a_stop_signal_during_start_up_ends_the_process_even_where_python_ignores_exceptions(
    installer: str, signum: int, code: int
) -> None:
    script = START_UP_HANDLERS[installer] + SIGNAL_IN_A_WEAKREF_CALLBACK.format(signum=int(signum))
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (code, ""), proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, EXIT_INTERRUPTED), (signal.SIGTERM, EXIT_TERMINATED)])
@pytest.mark.parametrize("presses", [1, 2])
def test_a_stop_signal_mid_run_saves_the_last_step_once(tmp_path: Path, signum: int, code: int, presses: int) -> None:
    log_path = tmp_path / "run"
    with running(example(log_path, "--max-steps", "100000", "--save-every", "0")) as proc:
        wait_for_steps(proc, log_path, 3)
        for _ in range(presses):
            proc.send_signal(signum)
            time.sleep(0.015)  # a second press 15 ms later: within the save
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err + out
    records = CheckpointLog(log_path).all()
    assert [r.reason for r in records] == ["cancelled"]
    assert Path(records[0].state_path, "weights.safetensors").exists()
    assert err.strip().splitlines()[-1].endswith(f"checkpoint of step {records[0].step} at {records[0].state_path} (resume with --resume)")
    assert records[0].step >= len(training_steps(log_path))


def test_a_third_ctrl_c_quits_without_waiting_for_the_save(tmp_path: Path) -> None:
    log_path = tmp_path / "run"
    with running(example(log_path, "--max-steps", "100000", "--save-every", "0")) as proc:
        wait_for_steps(proc, log_path, 3)
        for _ in range(3):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.002)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err + out
    # Either the save beat the third press, or the run quit and said so.
    assert "quitting without saving" in err or CheckpointLog(log_path).last() is not None


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_kill_9_at_random_moments_then_resume_trains_every_step_once(tmp_path: Path, mode: str) -> None:
    log_path = tmp_path / "run"
    rng = random.Random(f"kill-9 {mode}")
    flags = ["--mode", mode, "--max-steps", "24", "--save-every", "4", "--eval-every", "6", "--no-progress"]
    for kill in range(3):
        resume = ["--resume"] if kill else []
        with running(example(log_path, *flags, *resume)) as proc:
            wait_for_steps(proc, log_path, 1)
            time.sleep(rng.uniform(0.0, 1.5))
            proc.kill()
            proc.wait()
    with running(example(log_path, *flags, "--resume")) as proc:
        _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert training_steps(log_path) == list(range(24))
    last = CheckpointLog(log_path).last()
    assert last is not None and last.final and last.step == 24


def test_a_failed_run_prints_one_line_per_error_and_writes_the_traceback(tmp_path: Path) -> None:
    backend = FakeBackend()
    backend.fail_train = RuntimeError("the trainer's GPU fell off the bus")
    out = io.StringIO()
    code = run_cli(
        Config(log_path=tmp_path, eval_every=0), dataset=FakeDataset(3, 4), backend=backend, reporting=Reporting(out=out)
    )
    assert code == EXIT_ERROR
    lines = out.getvalue().splitlines()
    assert lines == [
        "error: RuntimeError: the trainer's GPU fell off the bus",
        f"full traceback in {tmp_path / ERROR_LOG}",
    ]
    assert "Traceback" in (tmp_path / ERROR_LOG).read_text()
