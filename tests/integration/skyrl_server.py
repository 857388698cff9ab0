"""Start and stop SkyRL's Tinker-API server (skyrl 0.3.0 or 0.4.0, JAX on CPU) for tests.

Two roles in one file:

* **Launcher** (run as a script in the integration venv)::

      python skyrl_server.py serve --base-model DIR --port N --database-url ... --checkpoints-base ...
      python skyrl_server.py engine <EngineConfig flags>   # started by `serve`, not by hand

  It works around two problems of skyrl 0.3.0 and 0.4.0 in a plain venv:

  1. ``skyrl.tinker.api`` starts its engine subprocess with ``uv run ...``,
     rebuilt from the parent's command line; outside ``uv`` that fails with
     "Unable to parse tinker API server startup command". ``serve`` replaces the
     command builder with ``[python, this file, "engine", flags...]``.
  2. ``skyrl/tinker/types.py`` puts a ``typing.TypedDict`` inside a pydantic
     model, which pydantic rejects below Python 3.12. Both roles import that
     module with ``typing.TypedDict`` pointed at ``typing_extensions.TypedDict``.

  It also binds 127.0.0.1 by default (skyrl's own default is 0.0.0.0), and on skyrl 0.4.0 adds
  the sampling promise's ``sample_sequence_ids`` that tinker SDK >= 0.26 requires
  (:func:`_add_sample_sequence_ids`).

* **Harness** (imported by ``conftest.py``): :func:`running_server` builds the
  tiny model into a temporary directory, starts ``serve`` on a free local port
  with its own SQLite database and checkpoint directory, waits until the API
  answers *and* the engine has loaded the model, and always stops both
  processes by PID.

The harness part imports neither skyrl nor tinker, so it can be read and
type-checked anywhere.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

THIS_FILE = Path(__file__).resolve()

ENGINE_READY_LINE = "Starting background engine..."
"""Logged by the engine once the model is loaded and it starts polling for requests."""

ENGINE_PID_PREFIX = "Started background engine with PID "
"""Logged by the API server right after it spawns the engine."""

HEALTH_PATH = "/api/v1/healthz"

_RICH_BOX = ("│", "╭", "╰")

DUMMY_API_KEY = "tml-dummy"
"""The SDK insists on a key starting with ``tml-``; the server ignores it."""

DEFAULT_BACKEND_CONFIG = '{"max_lora_adapters": 24, "sample_max_num_sequences": 16, "train_micro_batch_size": 2}'
"""Engine settings for tests.

``max_lora_adapters``: every training client (also one restored from a saved
state) holds an adapter slot until its session expires; 24 leaves room for a
whole test session (skyrl's default, 32, only makes the engine's arrays bigger).
``sample_max_num_sequences``: sampling batches are padded to this many
sequences, so JAX compiles sampling once per prompt-length bucket instead of
once per distinct batch size.
``train_micro_batch_size``: forward/backward runs in micro-batches of 2, so every
even-sized batch has the same (2, 32) shape and compiles once. (Gradients are
accumulated over micro-batches: the results are the same.)
"""


# --------------------------------------------------------------------------- launcher


def _set_parent_death_signal() -> None:
    """Ask Linux to SIGTERM this process when its parent dies.

    The harness stops everything by PID, but if pytest itself is SIGKILLed no
    Python code runs; this keeps the server (child of pytest) and the engine
    (child of the server) from outliving it. Best effort: no-op off Linux.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def _import_skyrl_types() -> None:
    """Import ``skyrl.tinker.types`` in a way that works on Python 3.11.

    The module does ``from typing import TypedDict`` at import time, so pointing
    ``typing.TypedDict`` at the ``typing_extensions`` version for the duration
    of that one import is enough; it is restored right after, and every later
    ``import skyrl.tinker.types`` gets the already-built module.
    """
    if sys.version_info >= (3, 12):
        return
    import typing

    import typing_extensions

    original = typing.TypedDict
    typing.TypedDict = typing_extensions.TypedDict
    try:
        import skyrl.tinker.types  # noqa: F401
    finally:
        typing.TypedDict = original


def _add_sample_sequence_ids(api: Any) -> None:
    """Have ``/api/v1/asample`` answer with one sequence id per sample, as tinker SDK >= 0.26 requires.

    SDK 0.26 and later (which tinker-cookbook 0.6.1 needs) take each sampled sequence's id from
    the ``sample_sequence_ids`` of the sampling promise, and fail an ``assert`` when it is absent;
    skyrl 0.4.0, written against SDK 0.25, does not send it. The route is re-registered with a
    response that adds the ids (``<request id>-<i>``: unique per sample, which is all the SDK
    needs of them). skyrl 0.3.0 (SDK 0.24.1, which knows no such field) is left as it is.
    """
    from importlib import metadata

    if tuple(int(part) for part in metadata.version("skyrl").split(".")[:2]) < (0, 4):
        return
    if "sample_sequence_ids" in api.FutureResponse.model_fields:
        return  # a skyrl that sends them itself
    from fastapi import Depends, Request

    original = api.asample
    route = next(r for r in api.app.router.routes if getattr(r, "path", "") == "/api/v1/asample")
    api.app.router.routes.remove(route)

    class FutureWithSequenceIds(api.FutureResponse):  # type: ignore[misc]
        sample_sequence_ids: list[str] | None = None

    session_dependency = Depends(api.get_session)

    async def asample(request: Any, req: Any, session: Any = session_dependency) -> Any:
        future = await original(request, req, session)
        ids = [f"{future.request_id}-{i}" for i in range(request.num_samples)]
        return FutureWithSequenceIds(**future.model_dump(), sample_sequence_ids=ids)

    # Real classes, not this file's postponed (string) annotations, for FastAPI to read the body by.
    asample.__annotations__ = {"request": api.SampleRequest, "req": Request, "return": FutureWithSequenceIds}
    api.app.post("/api/v1/asample", response_model=FutureWithSequenceIds)(asample)


def _serve(argv: Sequence[str]) -> None:
    """Run the API server (what ``python -m skyrl.tinker.api`` does, minus ``uv``)."""
    import argparse

    _import_skyrl_types()
    import uvicorn
    from skyrl.tinker import api
    from skyrl.tinker.config import EngineConfig, add_model, config_to_argv
    from skyrl.utils.log import get_uvicorn_log_config

    def engine_command(parent_cmd: list[str], engine_config: EngineConfig) -> list[str]:
        # Same flags skyrl would pass after `uv run ... -m skyrl.tinker.engine`,
        # but run by this interpreter through this file so the engine gets the
        # TypedDict fix too.
        del parent_cmd
        return [sys.executable, str(THIS_FILE), "engine", *config_to_argv(engine_config)]

    api._build_uv_run_cmd_engine = engine_command
    _add_sample_sequence_ids(api)

    parser = argparse.ArgumentParser(prog="skyrl_server.py serve")
    add_model(parser, EngineConfig)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8123)
    args = parser.parse_args(argv)
    config = EngineConfig.model_validate({k: v for k, v in vars(args).items() if k in EngineConfig.model_fields})
    api.app.state.engine_config = config
    uvicorn.run(api.app, host=args.host, port=args.port, log_config=get_uvicorn_log_config())


def _engine(argv: Sequence[str]) -> None:
    """Run the engine subprocess (what ``python -m skyrl.tinker.engine`` does)."""
    _set_parent_death_signal()
    _import_skyrl_types()
    from skyrl.tinker import engine

    sys.argv = ["skyrl.tinker.engine", *argv]
    engine.main()


def launcher_main(argv: Sequence[str]) -> None:
    """Dispatch ``serve`` / ``engine``."""
    if not argv or argv[0] not in ("serve", "engine"):
        sys.exit("usage: skyrl_server.py {serve,engine} [skyrl EngineConfig flags]")
    role, rest = argv[0], list(argv[1:])
    if role == "serve":
        _serve(rest)
    else:
        _engine(rest)


# --------------------------------------------------------------------------- harness


class ServerStartError(RuntimeError):
    """The server exited or did not become ready in time; the message holds its log tail."""


@dataclass
class SkyRLServer:
    """A running server started by :func:`running_server`.

    Attributes:
        base_url: ``http://127.0.0.1:<port>``, for ``TINKER_BASE_URL``.
        base_model: the model directory; pass exactly this string as ``base_model``.
        vocab_size: the tiny model's vocabulary size (token ids must be below it).
        eos_token_id: the tokenizer's end-of-sequence id (a stop token for sampling).
        workdir: the temporary directory holding model, database, checkpoints, log.
        log_path: the combined stdout/stderr of the server and its engine.
        process: the API server process.
        engine_pid: the engine subprocess, once the server has logged it.
        startup_s: seconds from launch until the engine was ready.
        model_build_s: seconds spent building the tiny model.
    """

    base_url: str
    base_model: str
    vocab_size: int
    eos_token_id: int
    workdir: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    engine_pid: int | None = None
    startup_s: float = 0.0
    model_build_s: float = 0.0
    command: list[str] = field(default_factory=list[str])
    env: dict[str, str] = field(default_factory=dict[str, str], repr=False)
    _stopped: bool = field(default=False, repr=False)

    def client_env(self) -> dict[str, str]:
        """Environment variables that point the tinker SDK at this server."""
        return client_env(self.base_url)

    def log_tail(self, max_lines: int = 60) -> str:
        """The last lines of the server log (for failure messages)."""
        return log_tail(self.log_path, max_lines)

    def stop(self, grace_s: float = 20.0) -> None:
        """Stop the server and its engine, each by PID: SIGTERM, then SIGKILL after ``grace_s``.

        Idempotent. The server's own shutdown normally terminates the engine
        (about 1.5 s); the engine is still checked and killed separately in case
        the server was killed before it could.
        """
        if self._stopped:
            return
        self._stopped = True
        # Learn the engine's PID before the server goes: once the server is gone
        # the engine is re-parented and no longer findable as its child.
        engine_pid = self.engine_pid or _engine_pid_from_log(self.log_path) or _first_child_pid(self.process.pid)
        _terminate_pid(self.process.pid, grace_s, popen=self.process)
        # Re-checked by command line: if the engine already exited, its PID may
        # have been reused by an unrelated process, which must not be signalled.
        if engine_pid is not None and _is_our_engine(engine_pid):
            _terminate_pid(engine_pid, grace_s)

    def kill(self) -> None:
        """SIGKILL the server and its engine at once, as a crashed machine would: nothing shuts down cleanly."""
        engine_pid = self.engine_pid or _engine_pid_from_log(self.log_path) or _first_child_pid(self.process.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)
        if engine_pid is not None and _is_our_engine(engine_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(engine_pid, signal.SIGKILL)
        self.engine_pid = None

    def restart(self, startup_timeout_s: float = 180.0) -> None:
        """Start the server again with the same command: same port, database, checkpoints and log file.

        Blocks until the new engine is ready (the log is appended to, so the ready
        line is looked for only after the restart).
        """
        if self.process.poll() is None:
            raise RuntimeError("restart() needs a stopped server; kill() it first")
        offset = self.log_path.stat().st_size
        with open(self.log_path, "ab") as log_file:
            # Linux sends the parent-death signal when the *thread* that started
            # the server exits: call this from a thread that outlives the server.
            self.process = subprocess.Popen(
                self.command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=self.workdir,
                preexec_fn=_set_parent_death_signal,  # safe: no threads started yet
            )
        _wait_ready(self, startup_timeout_s, log_offset=offset)


def client_env(base_url: str) -> dict[str, str]:
    """The SDK's environment for a local server: dummy key, no telemetry, no hub."""
    return {
        "TINKER_BASE_URL": base_url,
        "TINKER_API_KEY": DUMMY_API_KEY,
        "TINKER_TELEMETRY": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "JAX_PLATFORMS": "cpu",
    }


def server_env(workdir: Path, *, jax_cache: bool = True) -> dict[str, str]:
    """The environment for the server and engine processes."""
    env = dict(os.environ)
    env.update(
        {
            "JAX_PLATFORMS": "cpu",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TINKER_TELEMETRY": "0",
            # skyrl logs through rich, which wraps at 80 columns without a
            # terminal; the readiness lines must stay on one line to be found.
            "COLUMNS": "200",
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        }
    )
    if jax_cache:
        # A persistent compile cache in the run's own temp dir: the engine
        # process recompiles nothing it already compiled during this run (e.g.
        # after a restart); it cannot leak between runs.
        env.update(
            {
                "JAX_COMPILATION_CACHE_DIR": str(workdir / "jax-cache"),
                "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
            }
        )
    return env


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def log_tail(path: Path, max_lines: int = 60) -> str:
    """The last ``max_lines`` lines of ``path`` ('' if it does not exist)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return ""
    # rich draws tracebacks in boxes of source context; keep the lines that say
    # what happened (the exception line itself is outside the box).
    kept = [line.rstrip() for line in lines if line.strip() and not line.lstrip().startswith(_RICH_BOX)]
    return "\n".join(kept[-max_lines:])


def _engine_pid_from_log(path: Path, offset: int = 0) -> int | None:
    try:
        text = _read_from(path, offset)
    except FileNotFoundError:
        return None
    found = None
    for line in text.splitlines():  # the last one: a restarted server appends to the log
        if ENGINE_PID_PREFIX in line:
            digits = line.split(ENGINE_PID_PREFIX, 1)[1].split(":", 1)[0].strip()
            if digits.isdigit():
                found = int(digits)
    return found


def _read_from(path: Path, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode("utf-8", errors="replace")


def _first_child_pid(pid: int) -> int | None:
    """A child of ``pid`` from /proc (Linux), or None."""
    with contextlib.suppress(OSError, ValueError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            children = (task / "children").read_text().split()
            if children:
                return int(children[0])
    return None


def _is_our_engine(pid: int) -> bool:
    """Whether ``pid`` is an engine started through this file (Linux /proc; True elsewhere)."""
    cmdline_path = Path(f"/proc/{pid}/cmdline")
    if not Path("/proc/self/cmdline").exists():
        return True
    try:
        argv = cmdline_path.read_bytes().split(b"\0")
    except OSError:
        return False
    return str(THIS_FILE).encode() in argv and b"engine" in argv


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers signal 0; treat it as gone.
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    return True


def _terminate_pid(pid: int, grace_s: float, popen: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM ``pid``, wait up to ``grace_s``, then SIGKILL. Never raises for a gone process."""

    def gone() -> bool:
        if popen is not None:
            return popen.poll() is not None  # also reaps our own child
        return not _pid_alive(pid)

    if gone():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if gone():
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=5)


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(base_url + HEALTH_PATH, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait_ready(server: SkyRLServer, timeout_s: float, *, log_offset: int = 0) -> None:
    """Wait for ``/healthz`` and then for the engine's ready line.

    ``/healthz`` answers ~2 s after launch, long before the engine has loaded
    the model (~15-20 s); requests sent in between only queue, so the first
    call of a test would carry the whole start-up cost in its timeout.

    Raises:
        ServerStartError: the server exited, or ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    healthy = False
    while time.monotonic() < deadline:
        code = server.process.poll()
        if code is not None:
            raise ServerStartError(f"SkyRL server exited with code {code} during start-up:\n{server.log_tail()}")
        if server.engine_pid is None:
            server.engine_pid = _engine_pid_from_log(server.log_path, log_offset)
        healthy = healthy or _healthy(server.base_url)
        if healthy and ENGINE_READY_LINE in _read_from(server.log_path, log_offset):
            return
        time.sleep(0.25)
    what = "the engine's ready line" if healthy else HEALTH_PATH
    raise ServerStartError(f"SkyRL server not ready after {timeout_s:.0f} s (waiting for {what}):\n{server.log_tail()}")


@contextlib.contextmanager
def running_server(
    *,
    python: str = sys.executable,
    workdir: Path | None = None,
    keep_workdir: bool = False,
    backend_config: str = DEFAULT_BACKEND_CONFIG,
    startup_timeout_s: float = 180.0,
    jax_cache: bool = True,
) -> Iterator[SkyRLServer]:
    """Build the tiny model, start the server, yield it, and always stop it.

    Args:
        python: the interpreter of the integration venv (has skyrl installed).
        workdir: where to put model, database, checkpoints and log; a new
            temporary directory (removed afterwards) if None.
        keep_workdir: keep the temporary directory (for debugging).
        backend_config: JSON for skyrl's ``--backend-config``.
        startup_timeout_s: how long to wait for the engine to be ready.
        jax_cache: use a persistent JAX compile cache inside ``workdir``.

    Yields:
        The running :class:`SkyRLServer`.

    Raises:
        ServerStartError: if the server does not become ready.
    """
    # Under the name the other suites import it by (pytest runs from the repository root), so it
    # is one module, and one to the type checker. Needs torch and transformers.
    from tests.integration.tiny_model import build_tiny_model

    own_workdir = workdir is None
    # A 3-deep absolute path like /tmp/trio_rl_skyrl_xxx/tiny-qwen3 never has
    # exactly two '/' (see tiny_model.check_model_path).
    root = Path(tempfile.mkdtemp(prefix="trio_rl_skyrl_")) if workdir is None else workdir
    root.mkdir(parents=True, exist_ok=True)
    server: SkyRLServer | None = None
    try:
        t0 = time.monotonic()
        model = build_tiny_model(root / "models" / "tiny-qwen3")
        model_build_s = time.monotonic() - t0

        port = free_port()
        log_path = root / "server.log"
        command = [
            python,
            str(THIS_FILE),
            "serve",
            "--base-model",
            model.path,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--database-url",
            f"sqlite:///{root / 'tinker.db'}",
            "--checkpoints-base",
            str(root / "checkpoints"),
            # Unused with the JAX backend, but its default is a shared /tmp path.
            "--external-inference-lora-base",
            str(root / "lora_models"),
            "--backend-config",
            backend_config,
            # skyrl 0.3.0's default; 0.4.0's is "megatron", which needs ray and a GPU.
            "--backend",
            "jax",
        ]
        t1 = time.monotonic()
        env = server_env(root, jax_cache=jax_cache)
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(  # our own interpreter and script
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=root,
                preexec_fn=_set_parent_death_signal,  # safe: no threads started yet
            )
        server = SkyRLServer(
            base_url=f"http://127.0.0.1:{port}",
            base_model=model.path,
            vocab_size=model.vocab_size,
            eos_token_id=model.eos_token_id,
            workdir=root,
            log_path=log_path,
            process=process,
            model_build_s=model_build_s,
            command=command,
            env=env,
        )
        # If the interpreter exits without unwinding this generator (an
        # uncaught KeyboardInterrupt during collection, os._exit excluded),
        # atexit still stops the processes.
        atexit.register(server.stop)
        _wait_ready(server, startup_timeout_s)
        server.startup_s = time.monotonic() - t1
        yield server
    finally:
        if server is not None:
            server.stop()
            atexit.unregister(server.stop)
        if own_workdir and not keep_workdir:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    launcher_main(sys.argv[1:])
