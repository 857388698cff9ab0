"""Fail with one clear line when the ``hf`` extra is not installed."""

from __future__ import annotations

import importlib.util

INSTALL_HINT = "pip install 'trio_rl[hf]'"

_MODULES = ("transformers", "peft")


class MissingExtraError(ImportError):
    """The optional dependencies of the Hugging Face backend are not installed."""


def require_hf_extra() -> None:
    """Check that ``transformers`` and ``peft`` can be imported.

    Raises:
        MissingExtraError: naming the missing modules and the install command.
    """
    missing = [name for name in _MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(f"the Hugging Face backend needs {', '.join(missing)}: {INSTALL_HINT}")
