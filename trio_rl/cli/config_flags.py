"""Config's and AsyncConfig's fields as flags: each field's name, docstring and type make its flag, written nowhere else.

A dataclass of flags holds a :class:`~trio_rl.Config` (``config: Config = ...``); parsed
under :data:`CONFIG_FLAGS`, every field of that Config is a top-level ``--flag``, its
docstring is the help, and the Config given as the default supplies the defaults. So an
example that wants other defaults passes its own Config, and ``Config.validate`` checks the
values. A few fields differ on the command line, and say so here: :data:`NOT_FLAGS`,
:data:`FLAG_NAMES`, :data:`FLAG_TYPES`. An :class:`~trio_rl.AsyncConfig` among the flags
(``async_flags: AsyncConfig = ...``) has its fields as flags the same way, except
:data:`ASYNC_FROM_RUN_FLAGS`.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro
from tyro.constructors import (
    MISSING_NONPROP,
    ConstructorRegistry,
    StructConstructorSpec,
    StructFieldSpec,
    StructTypeInfo,
)

from ..config import LOSS_FNS, AsyncConfig, Config

NOT_FLAGS = frozenset(
    {"async_config", "stream_minibatch_config", "rollout_error_tolerance", "kl_reference_config", "termination"}
)
"""Config's structured fields: the run's flags build them (``--mode``, ``--error-strategy``, ``--kl-reference-model``)."""
FLAG_NAMES = {"base_model": "model"}
"""Flags named otherwise than their field."""
FLAG_TYPES: dict[str, Any] = {"log_path": Path, "loss_fn": Literal.__getitem__(LOSS_FNS), "max_steps": int}
"""Narrower types on the command line: a path, the losses as choices, and a finite run where the default
is one (examples size their data by it)."""
ASYNC_FROM_RUN_FLAGS = frozenset({"groups_per_batch", "loss_fn"})
"""AsyncConfig's fields that other flags set: ``--groups-per-batch`` (every mode's) and ``--loss-fn`` (Config's)."""


FLAG_STRUCTS: dict[type, frozenset[str]] = {Config: NOT_FLAGS, AsyncConfig: ASYNC_FROM_RUN_FLAGS}
"""The dataclasses whose fields are flags, each with the fields that are not."""


def config_rule(info: StructTypeInfo) -> StructConstructorSpec | None:
    """tyro's rule for a :class:`Config` or an :class:`AsyncConfig`: its fields as flags without a prefix.

    Args:
        info: the type tyro is about to parse, and its default (of that type, for the defaults).

    Returns:
        How tyro builds it from flags, or None for a type not in :data:`FLAG_STRUCTS`.
    """
    not_flags = FLAG_STRUCTS.get(info.type) if isinstance(info.type, type) else None
    return None if not_flags is None else _fields_as_flags(info, info.type, not_flags)


def _fields_as_flags(info: StructTypeInfo, cls: type, not_flags: frozenset[str]) -> StructConstructorSpec:
    """How tyro builds the dataclass ``cls`` from flags: each field but ``not_flags`` a flag, defaults from ``info``'s."""
    default: Any = info.default if isinstance(info.default, cls) else None
    types = typing.get_type_hints(cls)
    docs = field_docs(cls)
    fields = tuple(
        _flag(f, default, types[f.name], docs.get(f.name)) for f in dataclasses.fields(cls) if f.name not in not_flags
    )

    def instantiate(**values: Any) -> Any:
        return dataclasses.replace(default, **values) if default is not None else cls(**values)

    return StructConstructorSpec(instantiate=instantiate, fields=fields)


CONFIG_FLAGS = ConstructorRegistry()
"""The registry to parse under (``with CONFIG_FLAGS: tyro.cli(...)``) so that a Config's fields are flags."""
CONFIG_FLAGS.struct_rule(config_rule)


def _flag(f: dataclasses.Field[Any], defaults: object | None, annotation: Any, helptext: str | None) -> StructFieldSpec:
    """The flag of the field ``f``, its default taken from ``defaults`` (None: the field's own)."""
    if defaults is not None:
        default = getattr(defaults, f.name)
    else:
        default = f.default if f.default is not dataclasses.MISSING else MISSING_NONPROP
    # A None default keeps the field's own type, so that None stays a choice.
    flag_type = annotation if default is None else FLAG_TYPES.get(f.name, annotation)
    # No prefix: the flag is --learning-rate wherever the Config sits in the flags.
    spec: Any = Annotated[flag_type, tyro.conf.arg(name=FLAG_NAMES.get(f.name), prefix_name=False)]
    return StructFieldSpec(name=f.name, type=spec, default=default, helptext=helptext)


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of the dataclass ``cls``, as plain text on one line.

    Args:
        cls: a dataclass.

    Returns:
        Field name to its docstring, for the fields that have one (none without the source).
    """
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # no source, e.g. an install without .py files: flags without help
        return {}
    (tree,) = ast.parse(textwrap.dedent(source)).body
    assert isinstance(tree, ast.ClassDef)
    docs: dict[str, str] = {}
    for node, after in zip(tree.body, tree.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = plain_text(after.value.value)
    return docs


def plain_text(doc: str) -> str:
    """A docstring as a terminal shows it: one line, ``code`` without its quotes, :class:`~a.B` as B."""
    text = re.sub(r":[a-z]+:`(~?)([\w.]+)`", lambda m: m[2].rsplit(".", 1)[-1] if m[1] else m[2], doc)
    return " ".join(text.replace("``", "").split())
