"""The tests tree mirrors the code: unit tests per package, servers and contracts apart,
shared fakes and fixtures in ``tests/support/``, and no test module used as a library."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: The directories a test module may live in (with their subdirectories).
KINDS = ("unit", "server", "contract")
#: Where tests of something other than the ``agentkv`` package live, under tests/unit/.
OUTSIDE_THE_PACKAGE = {"scripts": ROOT / "scripts"}


def _python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def _test_modules() -> list[Path]:
    return [p for p in _python_files() if p.name.startswith("test_")]


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def test_every_test_module_sits_under_unit_server_or_contract() -> None:
    misplaced = [
        str(p.relative_to(TESTS))
        for p in _test_modules()
        if p.relative_to(TESTS).parts[0] not in KINDS
    ]
    assert misplaced == []


def test_every_test_directory_is_a_package() -> None:
    """Modules import as ``tests.<dir>...``: the same basename may sit in two directories."""
    missing = [
        str(d.relative_to(ROOT))
        for d in [TESTS, *(p.parent for p in _python_files())]
        if not (d / "__init__.py").is_file()
    ]
    assert sorted(set(missing)) == []


def test_unit_directories_mirror_the_package() -> None:
    """tests/unit/<name>/ tests agentkv/<name>/ (or a top-level folder such as scripts/)."""
    unmatched = []
    for d in sorted(p for p in (TESTS / "unit").rglob("*") if p.is_dir()):
        if d.name == "__pycache__":
            continue
        rel = d.relative_to(TESTS / "unit")
        top = OUTSIDE_THE_PACKAGE.get(rel.parts[0])
        source = top.joinpath(*rel.parts[1:]) if top else ROOT / "agentkv" / rel
        if not source.is_dir():
            unmatched.append(str(rel))
    assert unmatched == []


def test_no_module_imports_a_test_module() -> None:
    """What tests share lives in tests/support/, never in a module that also holds tests."""
    offenders = {
        str(p.relative_to(TESTS)): sorted(
            m
            for m in _imported_modules(p)
            if any(part.startswith("test_") for part in m.split("."))
        )
        for p in _python_files()
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_support_holds_no_tests() -> None:
    holders = [
        f"{p.name}:{node.name}"
        for p in sorted((TESTS / "support").glob("*.py"))
        for node in ast.walk(ast.parse(p.read_text("utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    ]
    assert [p.name for p in (TESTS / "support").glob("test_*.py")] == []
    assert holders == []


def test_shared_test_code_is_imported_from_tests_support() -> None:
    """A bare ``from offline_scheduler import ...`` (the flat tree's spelling) imports
    nothing once the module lives in tests/support/: only a run that reaches the import
    fails, so the spelling is checked here."""
    support = {p.stem for p in (TESTS / "support").glob("*.py")} | {"_support", "test_client_fakes"}
    offenders = {
        str(p.relative_to(TESTS)): sorted(
            m for m in _imported_modules(p) if m.split(".")[0] in support
        )
        for p in _python_files()
    }
    assert {k: v for k, v in offenders.items() if v} == {}
