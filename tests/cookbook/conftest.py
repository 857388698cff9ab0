"""The tinker-cookbook suite runs only where tinker-cookbook is installed (tests/cookbook/run.sh).

In the main venv these modules are not collected at all: they import the
cookbook at the top. run.sh fails if this suite ran no test, so a missing
cookbook cannot pass silently there.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.integration.tiny_model import TinyModel

if importlib.util.find_spec("tinker_cookbook") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: TinyModel) -> Any:
    """The tiny Qwen3's byte-level BPE tokenizer (tests/conftest.py's ``tiny_model``), loaded by the
    cookbook's own get_tokenizer, for the qwen3 renderer."""
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    return get_tokenizer(tiny_model.path)
