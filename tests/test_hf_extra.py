"""The ``hf`` extra stays optional: ``import trio_rl`` never imports transformers, and a
missing extra fails with one line naming the install command."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from trio_rl.backends.hf._extra import INSTALL_HINT, MissingExtraError, require_hf_extra


def test_importing_trio_rl_imports_neither_transformers_nor_peft() -> None:
    code = (
        "import sys, trio_rl, trio_rl.backends; "
        "print(sorted(m for m in ('transformers', 'peft') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


def test_a_missing_extra_names_the_install_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from trio_rl.backends import HFBackend

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(MissingExtraError, match="needs peft") as info:
        require_hf_extra()
    assert INSTALL_HINT in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(MissingExtraError, match="trio_rl\\[hf\\]"):
        HFBackend(log_dir=tmp_path)
