"""Sizes in trio_rl/: no class over 150 lines, no function over 60, none with more than 6 parameters.

Read from the source with :mod:`ast`. A function's lines run from its ``def`` to
its last line, docstring included, decorators not; a nested function counts in
its own right and within the function around it. A class's lines are the same
less its field declarations (an annotated name at class level and the docstring
under it): a settings object such as ``Config`` is as long as its fields are many,
and those are read one at a time, not followed as code is. Parameters are all of
them but ``self`` and ``cls``, ``*args`` and ``**kwargs`` included. Run it alone
with ``python -m pytest -q tests/test_code_sizes.py``; it names each offender.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import TypeGuard

import trio_rl

PACKAGE = Path(trio_rl.__file__).parent
MAX_CLASS_LINES = 150
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 6

Function = ast.FunctionDef | ast.AsyncFunctionDef


@functools.cache
def _parsed() -> tuple[tuple[str, ast.Module], ...]:
    return tuple(
        (path.relative_to(PACKAGE.parent).as_posix(), ast.parse(path.read_text(), str(path)))
        for path in sorted(PACKAGE.rglob("*.py"))
    )


def _nodes() -> Iterator[tuple[str, ast.AST]]:
    for where, tree in _parsed():
        for node in ast.walk(tree):
            yield where, node


def _span(node: ast.stmt) -> int:
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def _is_string(node: ast.stmt | None) -> TypeGuard[ast.Expr]:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _field_lines(node: ast.ClassDef) -> int:
    """Lines of the class's field declarations, each with the docstring that follows it."""
    lines = 0
    for statement, after in zip(node.body, [*node.body[1:], None], strict=True):
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            lines += _span(statement)
            if _is_string(after):
                lines += _span(after)
    return lines


def _parameters(node: Function) -> list[str]:
    args = node.args
    every = [*args.posonlyargs, *args.args, *args.kwonlyargs, *filter(None, [args.vararg, args.kwarg])]
    return [a.arg for a in every if a.arg not in ("self", "cls")]


def class_sizes() -> list[str]:
    """Each class over :data:`MAX_CLASS_LINES`, as ``file:line Name: N lines``."""
    found = []
    for where, node in _nodes():
        if isinstance(node, ast.ClassDef) and (lines := _span(node) - _field_lines(node)) > MAX_CLASS_LINES:
            found.append(f"{where}:{node.lineno} {node.name}: {lines} lines")
    return found


def function_sizes() -> list[str]:
    """Each function over :data:`MAX_FUNCTION_LINES`."""
    return [
        f"{where}:{node.lineno} {node.name}: {_span(node)} lines"
        for where, node in _nodes()
        if isinstance(node, Function) and _span(node) > MAX_FUNCTION_LINES
    ]


def parameter_counts() -> list[str]:
    """Each function with more than :data:`MAX_PARAMETERS` parameters."""
    return [
        f"{where}:{node.lineno} {node.name}: {len(names)} parameters ({', '.join(names)})"
        for where, node in _nodes()
        if isinstance(node, Function) and len(names := _parameters(node)) > MAX_PARAMETERS
    ]


def test_no_class_is_over_150_lines() -> None:
    assert class_sizes() == []


def test_no_function_is_over_60_lines() -> None:
    assert function_sizes() == []


def test_no_function_takes_more_than_6_parameters() -> None:
    assert parameter_counts() == []


def _measured(source: str) -> tuple[list[int], list[int], list[int]]:
    """Class lines, function lines and parameter counts of ``source``, by the rules above."""
    tree = ast.parse(source)
    classes = [_span(n) - _field_lines(n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    functions = [n for n in ast.walk(tree) if isinstance(n, Function)]
    return classes, [_span(n) for n in functions], [len(_parameters(n)) for n in functions]


def test_the_rules_count_what_they_say() -> None:
    source = '''
class Settings:
    a: int
    """the a"""
    b: int = 2
    c = 3

    def method(self, x, /, y, *rest, z, **more):
        """Two lines
        of docstring."""
        return x
'''
    classes, functions, parameters = _measured(source)
    # The class's 10 lines less a's two and b's one; the plain assignment c counts.
    assert classes == [7]
    assert functions == [4]
    # self is not counted; *rest and **more are.
    assert parameters == [5]
