"""The package's shape: no import cycles, no reaching into other modules' private names,
and one rule for missing test prerequisites. (Modules are sized by concept, not by a line
count: see docs/concepts.md.)

Everything here reads the source with ``ast``; nothing is imported or run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "agentkv"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
TREES: dict[str, ast.Module] = {m: ast.parse(p.read_text("utf-8")) for m, p in MODULES.items()}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node except those under ``if TYPE_CHECKING:`` (imports for type checkers only,
    which never run and so cannot form a cycle)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
            else:
                stack.append(child)


@dataclass(frozen=True)
class _Import:
    target: str  # the agentkv module the statement loads
    names: tuple[str, ...]  # for "from target import a, b": the imported names
    line: int


def _imports(module: str) -> list[_Import]:
    """agentkv imports of ``module``, at module level and inside functions alike."""
    out: list[_Import] = []
    for node in _runtime_nodes(TREES[module]):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "agentkv":
                    out.append(_Import(alias.name, (), node.lineno))
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] == "agentkv"
        ):
            out.append(_Import(node.module, tuple(a.name for a in node.names), node.lineno))
    return out


def _edges(module: str) -> set[str]:
    """The agentkv modules ``module`` imports (``from pkg import submodule`` counts as the
    submodule)."""
    targets: set[str] = set()
    for imp in _imports(module):
        subs = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in MODULES]
        if subs:
            targets.update(subs)
        if len(subs) < len(imp.names) or not imp.names:
            targets.add(imp.target)
    targets.discard(module)
    return {t for t in targets if t in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_cycle() -> None:
    """Module-level and function-level imports of agentkv modules form no cycle."""
    graph = {m: _edges(m) for m in MODULES}
    assert sum(len(e) for e in graph.values()) > 100  # the walk does see the imports
    assert _cycles(graph) == []


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(module: str) -> list[str]:
    """Underscore names of another agentkv module that ``module`` imports or reads.

    Importing a private *module* (``from agentkv.events import _pipeline``) is fine; what
    is flagged is a private name inside it: ``from agentkv.x import _name`` and
    ``alias._name`` where ``alias`` is bound to an agentkv module.
    """
    found: list[str] = []
    aliases: dict[str, str] = {}
    for imp in _imports(module):
        for name in imp.names:
            full = f"{imp.target}.{name}"
            if full in MODULES:
                aliases[name] = full
            elif _private(name) and imp.target != module:
                found.append(f"line {imp.line}: from {imp.target} import {name}")
    for node in _runtime_nodes(TREES[module]):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in MODULES and alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(TREES[module]):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _private(node.attr)
            and f"{aliases[node.value.id]}.{node.attr}" not in MODULES
            and aliases[node.value.id] != module
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_touches_another_modules_private_names() -> None:
    """Shared state goes behind the owning module's functions, never ``mod._state``."""
    offenders = {m: uses for m in MODULES if (uses := _private_uses(m))}
    assert offenders == {}


def test_tests_never_skip_a_missing_prerequisite_silently() -> None:
    """Dev extras are imported directly; anything else goes through tests/support/requires.py,
    which fails under CI instead of skipping."""
    offenders = [
        f"{p.relative_to(ROOT)}:{node.lineno}"
        for p in sorted((ROOT / "tests").rglob("*.py"))
        for node in ast.walk(ast.parse(p.read_text("utf-8")))
        if isinstance(node, ast.Attribute) and node.attr == "importorskip"
    ]
    assert offenders == []


def _targets(module: str) -> set[str]:
    """Every agentkv module ``module`` names in an import, type-checking imports too."""
    found: set[str] = set()
    for node in ast.walk(TREES[module]):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "agentkv")
        elif (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.level == 0
            and node.module.split(".")[0] == "agentkv"
        ):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _reaches(module: str, package: str) -> list[str]:
    return sorted(t for t in _targets(module) if t == package or t.startswith(package + "."))


def _in(package: str) -> list[str]:
    return [m for m in MODULES if m == package or m.startswith(package + ".")]


def test_the_simulator_and_the_workload_never_import_the_bench() -> None:
    """agentkv.sim builds on agentkv.workload, never on agentkv.bench (the bench may run
    the simulator, not the other way round); agentkv.workload needs neither."""
    assert len(_in("agentkv.sim")) > 5 and len(_in("agentkv.workload")) > 3
    offenders = {m: r for m in _in("agentkv.sim") if (r := _reaches(m, "agentkv.bench"))}
    for m in _in("agentkv.workload"):
        if r := _reaches(m, "agentkv.bench") + _reaches(m, "agentkv.sim"):
            offenders[m] = r
    assert offenders == {}
    assert any(_reaches(m, "agentkv.workload") for m in _in("agentkv.sim"))


def test_the_bench_floors_import_only_downwards() -> None:
    """bench.testbed imports neither bench.run nor bench.report, bench.run does not import
    bench.report, and within the bench only bench.report runs the simulator."""
    above = {
        "agentkv.bench.testbed": ("agentkv.bench.run", "agentkv.bench.report"),
        "agentkv.bench.run": ("agentkv.bench.report",),
    }
    offenders = {
        m: r
        for floor, higher in above.items()
        for m in _in(floor)
        if (r := [t for h in higher for t in _reaches(m, h)])
    }
    offenders |= {
        m: r
        for m in _in("agentkv.bench")
        if not m.startswith("agentkv.bench.report") and (r := _reaches(m, "agentkv.sim"))
    }
    assert offenders == {}
