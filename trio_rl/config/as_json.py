"""A configuration dataclass as JSON (``config.json``) and back: nested dataclasses carry their type's name."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from ..errors import ConfigError


def to_json(config: Any) -> dict[str, Any]:
    """A JSON-able view of the dataclass instance ``config``, one key per field.

    A nested dataclass becomes a dict of its fields plus ``"type"``, its class name; a
    path becomes a string.
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {"type": type(value).__name__, **dataclasses.asdict(value)}
        elif isinstance(value, Path):
            value = str(value)
        out[f.name] = value
    return out


def fields_from_json(cls: type, data: dict[str, Any], nested: Sequence[type]) -> dict[str, Any]:
    """The keyword arguments of ``cls`` that :func:`to_json` wrote as ``data``.

    Args:
        cls: the dataclass written.
        data: what :func:`to_json` returned (read back from JSON).
        nested: the dataclasses a field may hold, found by the ``"type"`` recorded.

    Raises:
        ConfigError: for an unknown field or a nested part of unknown type.
    """
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(unknown[0], f"is not a {cls.__name__} field (known: {', '.join(sorted(names))})")
    types = {t.__name__: t for t in nested}
    return {name: _from_json_value(name, value, types) for name, value in data.items()}


def _from_json_value(name: str, value: Any, types: dict[str, type]) -> Any:
    if not isinstance(value, dict):
        return value
    fields = dict(cast(dict[str, Any], value))
    if "type" in fields:
        type_name = str(fields.pop("type"))
        if type_name not in types:
            raise ConfigError(name, f"unknown type {type_name!r}; expected one of {', '.join(types)}")
        return types[type_name](**fields)
    return fields
