"""The tinker-cookbook suite runs only where tinker-cookbook is installed (tests/cookbook/run.sh).

In the main venv these modules are not collected at all: they import the
cookbook at the top. run.sh fails if this suite ran no test, so a missing
cookbook cannot pass silently there.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if importlib.util.find_spec("tinker_cookbook") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The byte-level BPE tokenizer of a tiny Qwen3 built on disk (tests/integration/tiny_model.py),
    loaded by the cookbook's own get_tokenizer, for the qwen3 renderer."""
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    from tests.integration.tiny_model import build_tiny_model

    return get_tokenizer(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny" / "qwen3").path)
