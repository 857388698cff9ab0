"""trio_rl's import graph: its packages and top-level modules import each other without a cycle.

The graph is read from the source with :mod:`ast`, so it holds every import,
those under ``if TYPE_CHECKING:`` and those inside functions included: a cycle
hidden from the interpreter is still one for a reader. Its nodes are the
subpackages (``trio_rl.loop``) and the top-level modules (``trio_rl.sinks``);
an import inside one node is no edge. Run it alone with
``python -m pytest -q tests/test_import_layers.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import trio_rl

PACKAGE = Path(trio_rl.__file__).parent
ROOT = "trio_rl"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _node(module: str) -> str:
    """The graph node of ``module``: the root package, a subpackage or a top-level module."""
    return ".".join(module.split(".")[:2])


def _is_submodule(name: str) -> bool:
    relative = Path(*name.split(".")[1:])
    return (PACKAGE / relative).is_dir() or (PACKAGE / relative).with_suffix(".py").is_file()


def _imported(path: Path, module: str) -> Iterator[str]:
    """Every module that ``path`` (the module ``module``) imports, as absolute names.

    A name imported from trio_rl's root that is not a submodule counts as the root itself.
    """
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for statement in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(statement, ast.Import):
            yield from (alias.name for alias in statement.names)
        elif isinstance(statement, ast.ImportFrom):
            if statement.level:
                base = package.split(".")[: len(package.split(".")) - statement.level + 1]
                target = ".".join([*base, *([statement.module] if statement.module else [])])
            else:
                target = statement.module or ""
            if target == ROOT:
                for alias in statement.names:
                    name = f"{ROOT}.{alias.name}"
                    yield name if _is_submodule(name) else ROOT
            else:
                yield target


def import_graph() -> dict[str, set[str]]:
    """Each node of trio_rl and the other nodes its modules import."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _node(_module_name(path))
        edges = graph.setdefault(source, set())
        for target in _imported(path, _module_name(path)):
            if (target == ROOT or target.startswith(ROOT + ".")) and _node(target) != source:
                edges.add(_node(target))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one node (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_packages_and_top_level_modules_import_each_other_without_a_cycle() -> None:
    assert cycles(import_graph()) == []


def test_the_layers_below_the_loop_import_no_loop_module() -> None:
    graph = import_graph()
    for layer in ("trio_rl.base", "trio_rl.rl", "trio_rl.config"):
        assert "trio_rl.loop" not in graph[layer], f"{layer} imports trio_rl.loop"


def test_the_base_layer_imports_none_of_the_layers_above_it() -> None:
    above = {"trio_rl.rl", "trio_rl.config", "trio_rl.loop", "trio_rl.backends", "trio_rl.sinks"}
    assert import_graph()["trio_rl.base"] & above == set()


def test_a_cycle_is_found_and_a_chain_is_not() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_under_type_checking_inside_functions_and_relative_ones_are_all_read(tmp_path: Path) -> None:
    source = tmp_path / "step_metrics.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from .. import _tinker_compat, train\n"
        "if TYPE_CHECKING:\n"
        "    from ..loop.step_runner import TrainedStep\n"
        "def f():\n"
        "    import trio_rl.sinks\n"
    )
    imported = set(_imported(source, "trio_rl.rl.step_metrics"))
    # ``train`` is a name of trio_rl's root, not a submodule: the root is imported.
    assert {"trio_rl._tinker_compat", "trio_rl", "trio_rl.loop.step_runner", "trio_rl.sinks"} <= imported
