"""Reading the run folder's ``.jsonl`` files as a crash may have left them."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, BinaryIO, TextIO, cast


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


def open_for_append(path: Path) -> TextIO:
    """``path`` opened to append records, with its last line ended first.

    A last line without its newline (left by an editor, a copy, a half-flushed
    write) would have the next record glued onto it, and the file would then
    read as damaged or lose that record as torn. So a whole record there gets
    its newline, and a torn fragment is cut with a :class:`RunFolderWarning`
    (as :func:`read_records` does with ``repair``): every append starts a line.
    """
    _end_last_line(path)
    return path.open("a")


def _end_last_line(path: Path) -> None:
    try:
        file = path.open("rb+")
    except FileNotFoundError:
        return
    with file:
        end = file.seek(0, os.SEEK_END)
        if end == 0:
            return
        file.seek(end - 1)
        if file.read(1) == b"\n":
            return
        start = _start_of_last_line(file, end)
        file.seek(start)
        tail = file.read(end - start)
        if tail.strip() and not _is_record(tail):
            warnings.warn(
                f"{path}: cutting its torn last line ({tail[:60]!r}) before appending, as a crash leaves it",
                RunFolderWarning,
                stacklevel=3,
            )
            file.truncate(start)
        else:
            file.seek(end)
            file.write(b"\n")


def _start_of_last_line(file: BinaryIO, end: int, chunk: int = 1 << 16) -> int:
    """The offset just after the last newline before ``end`` (0 if none); reads backwards, not the whole file."""
    position = end
    while position > 0:
        size = min(chunk, position)
        position -= size
        file.seek(position)
        newline = file.read(size).rfind(b"\n")
        if newline >= 0:
            return position + newline + 1
    return 0


def _is_record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
