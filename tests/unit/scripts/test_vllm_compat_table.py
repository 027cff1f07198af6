"""scripts/vllm_compat_table.py: the compat run's table from pytest's JUnit XML (pure)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "vllm_compat_table", ROOT / "scripts" / "vllm_compat_table.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


table = _load()

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.unit.vllm.test_plugin_offline" name="test_leases[Scheduler]"/>
<testcase classname="tests.unit.vllm.test_plugin_offline" name="test_leases[AsyncScheduler]">
  <failure message="AssertionError: assert 1 == 2&#10;more">trace</failure>
</testcase>
<testcase classname="tests.unit.vllm.test_plugin_offline" name="test_groups[Scheduler]"/>
<testcase classname="tests.unit.vllm.test_plugin_offline" name="test_groups[AsyncScheduler]">
  <skipped message="no"/>
</testcase>
<testcase classname="tests.unit.vllm.test_units" name="test_hint_flat_keys"/>
<testcase classname="tests.unit.vllm.test_units" name="test_bad_fields[extra0]"/>
<testcase classname="tests.unit.vllm.test_units" name="test_bad_fields[extra1]">
  <error message="RuntimeError: boom"/>
</testcase>
</testsuite></testsuites>
"""


@pytest.fixture
def junit(tmp_path: Path) -> Path:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT, "utf-8")
    return path


def test_cases_are_split_by_scheduler_class() -> None:
    assert table.split_case("test_x[AsyncScheduler]") == ("test_x", "AsyncScheduler")
    assert table.split_case("test_x[Scheduler-hooks]") == ("test_x[hooks]", "Scheduler")
    assert table.split_case("test_x[a-AsyncScheduler-b]") == ("test_x[a-b]", "AsyncScheduler")
    assert table.split_case("test_x[extra0]") == ("test_x[extra0]", table.ANY)
    assert table.split_case("test_x") == ("test_x", table.ANY)


def test_the_table_has_a_cell_per_test_and_class_and_folds_the_rest(junit: Path) -> None:
    t = table.read_junit(str(junit))
    assert t.total == 7 and t.failed == 2
    text = table.render(t, "vLLM 0.33.0")
    lines = text.splitlines()
    assert lines[0] == "vLLM 0.33.0"
    assert lines[1].split() == ["test", "Scheduler", "AsyncScheduler"]
    row = next(line for line in lines if line.strip().startswith("leases"))
    assert row.split() == ["leases", "pass", "FAIL"]
    row = next(line for line in lines if line.strip().startswith("groups"))
    assert row.split() == ["groups", "pass", "skip"]
    assert "unit/vllm/test_plugin_offline.py" in lines
    assert any("unit/vllm/test_units (3 cases)" in line and "FAIL 1/3" in line for line in lines)
    assert "5/7 cases passed, 2 failed" in text
    assert "AssertionError: assert 1 == 2" in text and "more" not in text
    assert "RuntimeError: boom" in text


def test_exit_status_says_whether_everything_passed(junit: Path, tmp_path: Path) -> None:
    assert table.main([str(junit)]) == 1
    ok = tmp_path / "ok.xml"
    ok.write_text(
        '<testsuite><testcase classname="tests.t" name="test_a[Scheduler]"/></testsuite>', "utf-8"
    )
    assert table.main([str(ok)]) == 0
    empty = tmp_path / "empty.xml"
    empty.write_text("<testsuite/>", "utf-8")
    assert table.main([str(empty)]) == 1  # nothing ran: not a pass
