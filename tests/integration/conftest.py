"""Pytest fixtures for the integration tests against a real SkyRL Tinker-API server.

The server is started once per pytest run (session scope) and always stopped,
also when a test fails or the run is interrupted. Run these tests from the
integration venv built by ``tests/integration/setup_env.sh``::

    .skyvenv/bin/python -m pytest -m integration tests/integration

This file is also imported when the ordinary suite runs from the main venv
(the tests are then deselected by ``-m 'not integration'``), so it must import
nothing that only the integration venv has.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests import skyrl_server and bounded by bare name

from skyrl_server import DUMMY_API_KEY, SkyRLServer, running_server

SDK_MAX_VERSION_EXCLUSIVE = (0, 25)
"""skyrl 0.3.0 parses JSON only; tinker 0.25+ sends protobuf and hangs on it."""

_current_server: SkyRLServer | None = None
_server_timings: dict[str, float] = {}


def _check_environment() -> None:
    """Fail early, with the fix, when run from the wrong venv."""
    if importlib.util.find_spec("skyrl") is None:
        pytest.fail(
            "skyrl is not installed in this interpreter; run the integration tests from the venv "
            "made by tests/integration/setup_env.sh (or just tests/integration/run.sh)",
            pytrace=False,
        )
    from importlib import metadata

    version = tuple(int(p) for p in metadata.version("tinker").split(".")[:2])
    if version >= SDK_MAX_VERSION_EXCLUSIVE:
        pytest.fail(
            f"tinker {metadata.version('tinker')} sends protobuf, which skyrl 0.3.0 cannot parse "
            "(calls hang); the integration venv pins tinker==0.24.1",
            pytrace=False,
        )


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt while the server runs.

    A CI timeout or a supervisor stops pytest with SIGTERM, whose default action
    kills the interpreter without running any ``finally``: the server would be
    left to the parent-death signal and the temp dir would stay. As an
    interrupt, pytest unwinds the session fixture and stops the server by PID.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.fixture(scope="session")
def skyrl_server() -> Iterator[SkyRLServer]:
    """The running server, with the SDK's environment variables pointing at it.

    Set ``SKYRL_KEEP_WORKDIR=1`` to keep the model, database and server log.
    """
    global _current_server
    _check_environment()
    keep = os.environ.get("SKYRL_KEEP_WORKDIR", "0") == "1"
    with _sigterm_as_interrupt(), running_server(keep_workdir=keep) as server:
        _current_server = server
        _server_timings.update(model_build_s=server.model_build_s, startup_s=server.startup_s)
        saved = {key: os.environ.get(key) for key in server.client_env()}
        os.environ.update(server.client_env())
        try:
            yield server
        finally:
            _current_server = None
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            if keep:
                print(f"\nSkyRL work dir kept at {server.workdir}", file=sys.stderr)


@pytest.fixture(scope="session")
def service_client(skyrl_server: SkyRLServer) -> Any:
    """One ``tinker.ServiceClient`` for the session (its holder thread is reused)."""
    import tinker

    return tinker.ServiceClient(base_url=skyrl_server.base_url, api_key=DUMMY_API_KEY)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "kills_server: kills and restarts the session's server; runs last")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests that kill the session's server after all the others (a stable sort keeps their order)."""
    items.sort(key=lambda item: item.get_closest_marker("kills_server") is not None)


# --------------------------------------------------------------------------- reporting


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    """Attach the server log's tail to a failed integration test's report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and _current_server is not None:
        report.sections.append(("SkyRL server log (tail)", _current_server.log_tail(80)))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Report what the server cost, so CI logs keep the numbers."""
    timings = _server_timings
    if timings:
        terminalreporter.write_line(
            "SkyRL server: model build {model_build_s:.1f} s, start-up to engine ready {startup_s:.1f} s".format(
                **timings
            )
        )
