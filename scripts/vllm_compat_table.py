"""Print the pass/fail table of a ``scripts/vllm_compat.sh`` run from pytest's JUnit XML.

One row per test case, one column per vLLM scheduler class it ran over (the parameter
``Scheduler`` / ``AsyncScheduler`` of ``tests/support/offline_scheduler.py`` in its id); the cases
that do not depend on the class are folded into one row per test file: ``pass`` when
every case passed, else the failed count (``FAIL 2/6``). Below the table, each
failure's first message line. Exit status 1 when anything failed or erred,
or when no test ran. Standard library only.

    python3 scripts/vllm_compat_table.py JUNIT.xml [--title TEXT]
"""

from __future__ import annotations

import argparse
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

#: Column names, in order: the scheduler classes, then class-independent tests.
CLASSES = ("Scheduler", "AsyncScheduler")
ANY = "any class"
_PARAMS = re.compile(r"^(?P<name>[^\[]+)(?:\[(?P<params>.*)\])?$")


@dataclass
class Cell:
    """The outcomes of one test's cases under one column."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped

    def text(self) -> str:
        if self.total == 0:
            return "-"
        if self.failed:
            return f"FAIL {self.failed}/{self.total}" if self.total > 1 else "FAIL"
        if self.passed == 0:
            return "skip"
        if self.skipped:
            return f"pass ({self.skipped} skip)"
        return "pass"


@dataclass
class Table:
    """Rows keyed by ``file::test``; failure messages in the order they were read."""

    rows: dict[str, dict[str, Cell]] = field(default_factory=dict)
    failures: list[tuple[str, str]] = field(default_factory=list)

    def add(self, row: str, column: str, outcome: str, message: str = "") -> None:
        cell = self.rows.setdefault(row, {}).setdefault(column, Cell())
        if outcome == "passed":
            cell.passed += 1
        elif outcome == "skipped":
            cell.skipped += 1
        else:
            cell.failed += 1
            self.failures.append((f"{row} [{column}]", message))

    @property
    def failed(self) -> int:
        return sum(c.failed for cols in self.rows.values() for c in cols.values())

    @property
    def total(self) -> int:
        return sum(c.total for cols in self.rows.values() for c in cols.values())


def split_case(name: str) -> tuple[str, str]:
    """(row, column) of a pytest test name: the row is the name without the scheduler
    class among its parameters, the column that class (or :data:`ANY`)."""
    m = _PARAMS.match(name)
    if m is None:  # pragma: no cover - pytest names always match
        return name, ANY
    base, params = m.group("name"), m.group("params")
    if not params:
        return base, ANY
    parts = params.split("-")
    column = next((p for p in parts if p in CLASSES), ANY)
    if column != ANY:
        parts.remove(column)
    return (f"{base}[{'-'.join(parts)}]" if parts else base), column


def _outcome(case: ET.Element) -> tuple[str, str]:
    for tag in ("failure", "error"):
        found = case.find(tag)
        if found is not None:
            text = (found.get("message") or found.text or tag).strip()
            return tag, text.splitlines()[0][:200] if text else tag
    if case.find("skipped") is not None:
        return "skipped", ""
    return "passed", ""


def read_junit(path: str) -> Table:
    """The table of the JUnit XML file pytest wrote at ``path``."""
    table = Table()
    for case in ET.parse(path).getroot().iter("testcase"):
        module = (case.get("classname") or "").removeprefix("tests.").replace(".", "/")
        base, column = split_case(case.get("name") or "")
        outcome, message = _outcome(case)
        table.add(f"{module}::{base}", column, outcome, message)
    return table


def render(table: Table, title: str = "") -> str:
    """The table as text: per module, one line per test run over the scheduler classes;
    the tests that do not depend on the class folded into one line per module."""
    by_module: dict[str, list[str]] = {}
    for row in sorted(table.rows):
        by_module.setdefault(row.split("::", 1)[0], []).append(row)
    per_class: list[tuple[str, dict[str, Cell]]] = []
    folded: list[tuple[str, Cell]] = []
    for module, rows in by_module.items():
        independent = Cell()
        count = 0
        for row in rows:
            cells = table.rows[row]
            if set(cells) == {ANY}:
                c = cells[ANY]
                independent.passed += c.passed
                independent.failed += c.failed
                independent.skipped += c.skipped
                count += 1
            else:
                per_class.append((row, cells))
        if count:
            folded.append((f"{module} ({count} cases)", independent))
    widths = [max(len(c), 9) for c in CLASSES]
    label_w = min(
        72,
        max(
            [len(r.split("::", 1)[1].removeprefix("test_")) + 2 for r, _ in per_class]
            + [len(n) + 2 for n, _ in folded]
            + [4]
        ),
    )

    def line(label: str, texts: list[str]) -> str:
        if len(label) > label_w:
            label = label[: label_w - 1] + "…"
        return (
            label.ljust(label_w)
            + "".join(" " + t.ljust(w) for t, w in zip(texts, widths, strict=True))
        ).rstrip()

    lines = [title] if title else []
    header = line("test", list(CLASSES))
    lines += [header, "-" * len(header)]
    module = None
    for row, cells in per_class:
        mod, name = row.split("::", 1)
        if mod != module:
            lines.append(f"{mod}.py")
            module = mod
        lines.append(
            line("  " + name.removeprefix("test_"), [cells.get(c, Cell()).text() for c in CLASSES])
        )
    if folded:
        lines.append("independent of the scheduler class")
        for label, cell in folded:
            lines.append(line("  " + label, [cell.text(), ""]))
    lines.append(f"{table.total - table.failed}/{table.total} cases passed, {table.failed} failed")
    for where, message in table.failures:
        lines.append(f"  FAILED {where}: {message}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", help="pytest --junitxml output")
    parser.add_argument("--title", default="", help="a line printed above the table")
    args = parser.parse_args(argv)
    table = read_junit(args.junit)
    print(render(table, args.title))
    return 1 if table.failed or table.total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
