"""The packages' imports point one way: no module imports, at any depth, a module that imports it back.

A cycle works only while every member defers the import that closes it; it breaks when someone moves that
import to the top or calls the other side first. Imports inside functions count (they run at call time),
imports under ``if TYPE_CHECKING:`` do not (they never run).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("farm", "worker", "cosmos3", "toy")


def module_names() -> dict[str, Path]:
    names = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node outside ``if TYPE_CHECKING:`` blocks."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_modules(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports: ``from a.b import c`` is ``a.b.c`` where that is a module, else ``a.b``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        found.update(target for target in targets if target in known and target != name)
    return found


def import_graph() -> dict[str, set[str]]:
    known = module_names()
    return {name: imported_modules(name, path, known) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first == last), or None: a depth-first search for a back edge."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" after
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_packages_import_one_way():
    graph = import_graph()
    assert "cosmos3.ops" in graph["cosmos3.layers.attention_kernels"]  # the graph sees real imports
    cycle = find_cycle(graph)
    assert cycle is None, (f"import cycle: {' -> '.join(cycle)}; move the names both sides need into a leaf "
                           "module that imports neither")


@pytest.mark.parametrize("sources, cycle", [
    ({"a": "from pkg import b\n", "b": "def f():\n    from pkg.a import g\n"}, ["pkg.a", "pkg.b", "pkg.a"]),
    ({"a": "import pkg.b\n", "b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"}, None),
    ({"a": "from . import b\n", "b": "from .a import g\n"}, ["pkg.a", "pkg.b", "pkg.a"]),
])
def test_the_check_finds_function_level_and_relative_cycles(tmp_path, sources, cycle):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    known = {"pkg": tmp_path / "pkg" / "__init__.py"}
    for name, text in sources.items():
        (tmp_path / "pkg" / f"{name}.py").write_text(text)
        known[f"pkg.{name}"] = tmp_path / "pkg" / f"{name}.py"
    graph = {name: imported_modules(name, path, known) for name, path in known.items()}
    assert find_cycle(graph) == cycle
