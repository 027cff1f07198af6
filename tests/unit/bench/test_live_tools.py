"""The live agent's tools really run on a project folder; the step schema bounds the model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agentkv.bench.live._tools import (
    GapSampler,
    ToolBox,
    compute_arithmetic,
    step_schema,
    tool_schemas,
)


@pytest.fixture()
def box(tmp_path: Path) -> ToolBox:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("def parse_date():\n    pass\n", "utf-8")
    (tmp_path / "README.md").write_text("hello\n", "utf-8")
    (tmp_path / ".run_tests.txt").write_text("1 failed: test_x\n", "utf-8")
    return ToolBox(tmp_path, GapSampler([0.0]))


def _call(box: ToolBox, name: str, **args: object) -> str:
    return asyncio.run(box.call(name, dict(args)))


def test_arithmetic_evaluates_and_refuses_anything_else() -> None:
    assert compute_arithmetic("17 * 23") == 391
    assert compute_arithmetic("(4 + 5) * 3 - 2 ** 3") == 19
    assert compute_arithmetic("7 / 2") == 3.5
    for bad in ("__import__('os')", "2 ** 1000", "1 / 0", "x + 1", "1 +"):
        with pytest.raises(ValueError):
            compute_arithmetic(bad)


def test_the_file_tools_read_the_project_and_stay_inside_it(box: ToolBox) -> None:
    assert box.files == ["README.md", "src/a.py"] and box.folders == [".", "src"]
    assert _call(box, "list_files", path=".") == "README.md\nsrc/"
    assert _call(box, "read_file", path="README.md") == "hello\n"
    assert _call(box, "search", text="parse_date") == "src/a.py:1: def parse_date():"
    assert _call(box, "read_file", path="../etc/passwd").startswith("error: ")
    assert _call(box, "read_file", path="nope.txt") == "error: no file nope.txt"
    assert _call(box, "calc", expression="2 +").startswith("error: ")
    assert _call(box, "calc", expression="6 / 3") == "2"
    assert _call(box, "run_tests") == "1 failed: test_x"
    assert _call(box, "no_such_tool") == "error: no tool no_such_tool"
    assert _call(box, "read_file").startswith("error: ")  # missing argument


def test_run_times_follow_the_trace_gaps_capped_and_the_same_for_a_key() -> None:
    sampler = GapSampler(max_gap_s=3.0)  # the bundled traces' shell tool
    draws = [sampler.draw_s(f"0-0-task{i}") for i in range(50)]
    assert all(0.0 <= d <= 3.0 for d in draws)
    assert len(set(draws)) > 3
    assert draws == [GapSampler(max_gap_s=3.0).draw_s(f"0-0-task{i}") for i in range(50)]


def test_the_step_schema_offers_only_the_tasks_tools_and_real_paths(box: ToolBox) -> None:
    schema = step_schema(["read_file"], box)
    read, answer = schema["anyOf"]
    assert read["properties"]["path"] == {"enum": ["README.md", "src/a.py"]}
    assert read["properties"]["tool"] == {"const": "read_file"}
    assert answer["properties"]["tool"] == {"const": "answer"}
    assert [t["function"]["name"] for t in tool_schemas()] == [
        "list_files",
        "read_file",
        "search",
        "calc",
        "run_tests",
    ]
