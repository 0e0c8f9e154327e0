"""The packages' imports point one way, and each room of ``cosmos3`` imports only the rooms below it.

A cycle works only while every member defers the import that closes it; it breaks when someone moves that
import to the top or calls the other side first. Imports inside functions count (they run at call time),
imports under ``if TYPE_CHECKING:`` do not (they never run). The rooms and what each may import are drawn in
docs/architecture.md ("Layers").
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


# Each room of cosmos3 and what it may import besides itself and cosmos3.errors (the exceptions every room raises).
# A module directly in cosmos3/ (the model and the pipeline) is the room "cosmos3" and may import every room.
COSMOS3_ROOMS = {
    "cosmos3.rules": set(),  # torch-free: farm validate runs these (tests/cosmos3/test_rules.py)
    "cosmos3.ops": set(),
    "cosmos3.quant": {"cosmos3.ops", "cosmos3.rules"},
    "cosmos3.layers": {"cosmos3.ops", "cosmos3.quant", "cosmos3.rules"},
    "cosmos3.checkpoint": {"cosmos3.ops", "cosmos3.quant", "cosmos3.layers", "cosmos3.rules", "cosmos3"},
    "cosmos3": {"cosmos3.ops", "cosmos3.quant", "cosmos3.layers", "cosmos3.rules", "cosmos3.checkpoint"},
}


def room(module: str) -> str:
    """The room a module lives in: a sub-package of cosmos3 named in COSMOS3_ROOMS, else its top-level package."""
    parts = module.split(".")
    if parts[0] == "cosmos3" and len(parts) > 1 and f"cosmos3.{parts[1]}" in COSMOS3_ROOMS:
        return f"cosmos3.{parts[1]}"
    return parts[0]


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a cosmos3 module into a cosmos3 room that may not import it, and any import by cosmos3
    of the packages built on it (farm, worker, toy)."""
    found = []
    for name, targets in sorted(graph.items()):
        if room(name) not in COSMOS3_ROOMS:
            continue
        allowed = COSMOS3_ROOMS[room(name)] | {room(name)}
        for target in sorted(targets):
            if target == "cosmos3.errors":
                continue
            if room(target) not in allowed:
                found.append(f"{name} imports {target} (room {room(target)})")
    return found


def test_each_cosmos3_room_imports_only_the_rooms_below_it():
    graph = import_graph()
    assert "cosmos3.ops.launch_table" in graph["cosmos3.ops.loader"]  # the graph sees the rooms' modules
    violations = room_violations(graph)
    assert violations == [], ("imports against the rooms of docs/architecture.md:\n  " + "\n  ".join(violations))


def test_the_room_check_finds_a_rule_importing_torch_code():
    graph = {"cosmos3.rules.request": {"cosmos3.pipeline", "cosmos3.errors"}, "cosmos3.pipeline": set(),
             "cosmos3.errors": set(), "cosmos3.ops": {"farm.job"}, "farm.job": set()}
    assert room_violations(graph) == ["cosmos3.ops imports farm.job (room farm)",
                                      "cosmos3.rules.request imports cosmos3.pipeline (room cosmos3)"]


# The driver/worker contract: the farm's leaf modules a worker may import (what a job is, how a result is
# published, the faults a worker raises, the metrics, this host's processes, the escaping of what reaches a terminal).
# They import no other farm module.
FARM_CONTRACT = {"farm.job", "farm.storage", "farm.errors", "farm.metrics", "farm.processes", "farm.template",
                 "farm.terminal"}


def contract_violations(graph: dict[str, set[str]]) -> list[str]:
    """A worker module importing a farm module outside the contract, or a contract module importing one (or the
    worker)."""
    found = []
    for name, targets in sorted(graph.items()):
        if room(name) == "worker" or name in FARM_CONTRACT:
            found += [f"{name} imports {target}" for target in sorted(targets)
                      if (room(target) == "farm" and target not in FARM_CONTRACT and target != "farm")
                      or (name in FARM_CONTRACT and room(target) == "worker")]
    return found


def test_the_worker_imports_only_the_farms_contract():
    graph = import_graph()
    assert "farm.job" in graph["worker.actor"]  # the graph sees the worker's imports
    violations = contract_violations(graph)
    assert violations == [], ("the worker reaches into the farm (move what both need into a contract module):\n  "
                              + "\n  ".join(violations))


def test_the_contract_check_finds_an_internal_import():
    graph = {"worker.encode": {"farm.lease", "farm.errors"}, "farm.storage": {"worker.actor"},
             "farm.lease": set(), "farm.errors": set(), "worker.actor": set()}
    assert contract_violations(graph) == ["farm.storage imports worker.actor", "worker.encode imports farm.lease"]


def top_level_imports(path: Path, root: Path = ROOT) -> set[str]:
    """The top-level names a file imports (``tests`` for ``from tests.farm import x``); relative imports name their
    own package."""
    found = set()
    for node in _imports(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif node.level:
            found.add(path.relative_to(root).parts[0])
        elif node.module:
            found.add(node.module.split(".")[0])
    return found


def crossings(root: Path = ROOT) -> list[str]:
    """Imports between tests and benchmarks: benchmarks and testbed never import tests; tests import benchmarks only
    in tests/benchmarks/ (the benchmarks' own tests); testbed never imports benchmarks."""
    rules = {"benchmarks": {"tests"}, "testbed": {"tests", "benchmarks"}, "tests": {"benchmarks"}}
    found = []
    for folder, forbidden in rules.items():
        for path in sorted((root / folder).rglob("*.py")):
            if folder == "tests" and path.is_relative_to(root / "tests" / "benchmarks"):
                continue
            names = sorted(top_level_imports(path, root) & forbidden)
            found += [f"{path.relative_to(root)} imports {name}" for name in names]
    return found


def test_tests_and_benchmarks_share_testbed_and_never_import_each_other():
    assert "testbed" in top_level_imports(ROOT / "benchmarks" / "bench_autoscale.py")  # the check sees imports
    assert crossings() == []


def test_the_crossing_check_finds_each_direction(tmp_path):
    files = {("benchmarks", "bench_x.py"): "from tests.farm.helpers import f\n",
             ("tests", "cosmos3", "test_x.py"): "def t():\n    from benchmarks.bench_x import g\n",
             ("tests", "benchmarks", "test_bench_x.py"): "import benchmarks.bench_x\n",
             ("testbed", "inputs.py"): "import json\n"}
    for parts, text in files.items():
        tmp_path.joinpath(*parts[:-1]).mkdir(parents=True, exist_ok=True)
        tmp_path.joinpath(*parts).write_text(text)
    assert crossings(tmp_path) == [f"{Path('benchmarks', 'bench_x.py')} imports tests",
                                   f"{Path('tests', 'cosmos3', 'test_x.py')} imports benchmarks"]


def sys_path_edits(path: Path) -> list[int]:
    """Lines that change ``sys.path`` (``sys.path.insert/append/extend(...)``, or an assignment to it)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in (
                "insert", "append", "extend"):
            target = node.func.value
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if target is not None and ast.unparse(target) == "sys.path":
            lines.append(node.lineno)
    return lines


def test_no_benchmark_edits_sys_path():
    """Benchmarks run as ``python -m benchmarks.bench_x`` from the checkout's root, which puts the root on the path."""
    edits = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "benchmarks").glob("*.py"))
             if (lines := sys_path_edits(p))}
    assert edits == {}


@pytest.mark.parametrize("source, lines", [
    ("import sys\nsys.path.insert(0, 'x')\n", [2]),
    ("import sys\nsys.path += ['x']\n", [2]),
    ("import sys\nprint(sys.path)\npath = []\npath.append(1)\n", []),
])
def test_the_sys_path_check_finds_edits(tmp_path, source, lines):
    (tmp_path / "bench.py").write_text(source)
    assert sys_path_edits(tmp_path / "bench.py") == lines


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
