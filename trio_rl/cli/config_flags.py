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


def config_rule(info: StructTypeInfo) -> StructConstructorSpec | None:
    """tyro's rule for a :class:`Config`: its fields as flags without a prefix, defaults from the Config given.

    Args:
        info: the type tyro is about to parse, and its default (a Config, for the defaults).

    Returns:
        How tyro builds a Config from flags, or None for any other type.
    """
    if info.type is not Config:
        return None
    default = info.default if isinstance(info.default, Config) else None
    types = typing.get_type_hints(Config)
    docs = field_docs(Config)
    fields = tuple(
        _flag(f, default, types[f.name], docs.get(f.name))
        for f in dataclasses.fields(Config)
        if f.name not in NOT_FLAGS
    )

    def instantiate(**values: Any) -> Config:
        return dataclasses.replace(default, **values) if default is not None else Config(**values)

    return StructConstructorSpec(instantiate=instantiate, fields=fields)


def async_config_rule(info: StructTypeInfo) -> StructConstructorSpec | None:
    """tyro's rule for an :class:`AsyncConfig`: its fields as flags without a prefix, as :func:`config_rule` does.

    Args:
        info: the type tyro is about to parse, and its default (an AsyncConfig, for the defaults).

    Returns:
        How tyro builds an AsyncConfig from flags, or None for any other type.
    """
    if info.type is not AsyncConfig:
        return None
    default = info.default if isinstance(info.default, AsyncConfig) else None
    types = typing.get_type_hints(AsyncConfig)
    docs = field_docs(AsyncConfig)
    fields = tuple(
        _flag(f, default, types[f.name], docs.get(f.name))
        for f in dataclasses.fields(AsyncConfig)
        if f.name not in ASYNC_FROM_RUN_FLAGS
    )

    def instantiate(**values: Any) -> AsyncConfig:
        return dataclasses.replace(default, **values) if default is not None else AsyncConfig(**values)

    return StructConstructorSpec(instantiate=instantiate, fields=fields)


CONFIG_FLAGS = ConstructorRegistry()
"""The registry to parse under (``with CONFIG_FLAGS: tyro.cli(...)``) so that a Config's fields are flags."""
CONFIG_FLAGS.struct_rule(config_rule)
CONFIG_FLAGS.struct_rule(async_config_rule)


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
