"""SIGUSR1 on the command line prints the run's stall report, and the run goes on."""

from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.pipeline_helpers import make_config
from trio_rl import RunHandle, train
from trio_rl.cli.signals import print_reports_on_signal
from trio_rl.testing import FakeBackend, FakeDataset, FakeEnvSpec

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="no SIGUSR1 on this platform")


class _Terminal(io.StringIO):
    """Text written, and an event set once a report has been written."""

    def __init__(self) -> None:
        super().__init__()
        self.reported = trio.Event()

    def write(self, text: str) -> int:
        if "Trio task tree" in text:
            self.reported.set()
        return super().write(text)


async def test_sigusr1_prints_the_report_of_a_running_run(tmp_path: Path) -> None:
    out = _Terminal()
    spec = FakeEnvSpec(group_size=2, hang_at={(0, 1)})
    config = make_config(tmp_path, "sync", stall_warning_s=None)
    with trio.fail_after(30):
        async with FakeBackend() as backend, trio.open_nursery() as nursery:
            handle: RunHandle = await nursery.start(
                lambda task_status: train(
                    config, dataset=FakeDataset(1, 2, spec), backend=backend, task_status=task_status
                )
            )
            await nursery.start(print_reports_on_signal, handle.stall_report, out)
            await trio.testing.wait_all_tasks_blocked()
            os.kill(os.getpid(), signal.SIGUSR1)
            await out.reported.wait()
            nursery.cancel_scope.cancel()
    report = out.getvalue()
    assert "group 0/1: age" in report and "env_step" in report
    assert "trainer: waiting on 1 x train_step, 1 x wait_for_groups" in report
