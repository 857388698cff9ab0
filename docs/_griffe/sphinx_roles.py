"""A griffe extension: the reStructuredText in trio_rl's docstrings, made readable as Markdown.

The docstrings write ``:class:`~trio_rl.FailFast``` for Sphinx; Markdown would show the role
itself. The role becomes a code span with the name Sphinx would show: the last component
after ``~``, the whole target otherwise. Not links: a target outside the API pages would
fail the strict build. A paragraph ending in ``::`` (RST's "a literal block follows") ends
in ``:``; the indented block after it is already a Markdown code block.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_AFTER_TEXT = re.compile(r"(?<=\S)::$", re.MULTILINE)
_ALONE = re.compile(r"^[ \t]*::$", re.MULTILINE)
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|exc|data|obj|const):`(~?)([^`<]+?)(?:\s*<([^`>]+)>)?`")


def _shown(match: re.Match[str]) -> str:
    tilde, target, explicit = match.groups()
    if explicit is not None:  # :class:`title <target>`
        return f"`{target.strip()}`"
    return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _ROLE.sub(_shown, obj.docstring.value)
            obj.docstring.value = _ALONE.sub("", _AFTER_TEXT.sub(":", text))
