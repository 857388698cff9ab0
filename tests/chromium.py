"""Headless Chromium (Debian's ``chromium``) for the tests and the guide's screenshots: render a page, list its console messages."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium")
"""The browser, or None where it is not installed (CI installs Debian's package)."""

_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
)
_CONSOLE = re.compile(r":CONSOLE[:(]\d+\)?\] (.*)")


@dataclass(frozen=True)
class Rendered:
    """What Chromium made of a page: its DOM after load, and every console message it logged."""

    dom: str
    console: list[str]


def _chromium(page: Path, *extra: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "Chromium is not installed"
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", *extra, page.resolve().as_uri()],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )


def render(page: Path) -> Rendered:
    """Load ``page`` and return its DOM (``--dump-dom``) and console messages (from Chromium's log)."""
    done = _chromium(page, "--dump-dom")
    return Rendered(done.stdout, [m[1] for line in done.stderr.splitlines() if (m := _CONSOLE.search(line))])


def screenshot(page: Path, out: Path, *, width: int = 1200, height: int = 800) -> None:
    """Save a PNG of ``page`` as a ``width`` x ``height`` window shows it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _chromium(page, f"--screenshot={out.resolve()}", f"--window-size={width},{height}", "--hide-scrollbars")
    assert out.exists(), f"Chromium wrote no screenshot to {out}"
