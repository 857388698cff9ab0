"""Reading the run folder's ``.jsonl`` files as a crash may have left them."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, cast


class RunFolderWarning(UserWarning):
    """Something in a run folder was damaged and was skipped (a torn line, a checkpoint that does not load)."""


class DamagedFileError(ValueError):
    """A run-folder file that cannot be read; the message names the file, the line and what to do."""


def read_records(path: Path, *, repair: bool = False) -> list[dict[str, Any]]:
    """The records of a ``.jsonl`` file, ignoring a torn last line.

    A process killed while appending leaves at most its last line incomplete;
    that line is ignored with a :class:`RunFolderWarning`. With ``repair``, it is
    also cut from the file, so that the next append starts on a line of its own.

    Raises:
        DamagedFileError: a line before the last one is not a JSON object.
    """
    if not path.exists():
        return []
    text = path.read_text()
    lines: list[str] = text.split("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            parsed: Any = json.loads(line)
            if not isinstance(parsed, dict):
                raise ValueError("not a JSON object")
            record = cast(dict[str, Any], parsed)
        except ValueError as exc:
            if any(rest.strip() for rest in lines[number:]):
                raise DamagedFileError(
                    f"{path}, line {number}: {exc}; only a last line can be torn by a crash, so this file was "
                    "edited or corrupted: restore it, or delete the run folder and start again"
                ) from None
            warnings.warn(
                f"{path}: ignoring its torn last line {number} ({line[:60]!r}), as a crash leaves it",
                RunFolderWarning,
                stacklevel=2,
            )
            if repair:
                path.write_text("".join(kept + "\n" for kept in lines[: number - 1] if kept.strip()))
            break
        records.append(record)
    return records


def rewrite_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace the file's records (atomically: a crash leaves the old file or the new one)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(json.dumps(record) + "\n" for record in records))
    partial.replace(path)
