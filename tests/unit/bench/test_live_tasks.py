"""Live-agent tasks: checkers judge answers, task files are validated with the line at fault."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentkv._errors import ConfigError
from agentkv.bench.live._tasks import BUNDLED_PROJECT, check_answer, load_tasks, parse_check

#: A right and a wrong answer for every bundled task.
ANSWERS = {
    "calc-product": ("17 * 23 = 391", "It is 381."),
    "calc-eggs": ("7 boxes hold 84 eggs", "168"),
    "read-version": ("The version is 2.4.1.", "2.4.0"),
    "read-port": ("It listens on port 8,080", "port 80"),
    "read-author": ("Grace Hopper's group", "Ada Lovelace"),
    "list-src": ("src/tally/counter.py", "dates.py"),
    "search-parse-date": ("src/tally/dates.py", "test_parse_date in tests"),
    "tests-failing": ("test_leap_year fails", "test_parse_date"),
}


def test_number_check_finds_the_number_among_the_answers_numbers() -> None:
    check = {"number": 8080}
    assert check_answer(check, "8,080")
    assert check_answer(check, "port 8080.0 it is")
    assert check_answer(check, "It listens on port 8080 and has 3 workers.")
    assert check_answer(check, "8080, not 80")
    assert not check_answer(check, "port 18080 or 80")
    assert not check_answer(check, "8080.5")
    assert not check_answer(check, "no number")
    assert not check_answer(check, None)


def test_contains_checks_are_case_insensitive_any_or_all() -> None:
    assert check_answer({"contains": ["paris", "Lyon"]}, "It is PARIS.")
    assert not check_answer({"contains": ["paris"]}, "Rome")
    assert check_answer({"contains_all": ["a.py", "b.py"]}, "A.py and b.py")
    assert not check_answer({"contains_all": ["a.py", "b.py"]}, "only a.py")


@pytest.mark.parametrize(
    "raw",
    [
        {"number": "8"},
        {"number": True},
        {"contains": []},
        {"contains": [""]},
        {"regex": "x"},
        {"number": 1, "contains": ["x"]},
        "391",
    ],
)
def test_a_bad_checker_is_refused_with_what_to_write(raw: object) -> None:
    with pytest.raises(ConfigError, match="check"):
        parse_check(raw, "tasks.jsonl:1")


def test_every_bundled_task_accepts_its_right_answer_and_rejects_a_wrong_one() -> None:
    tasks = load_tasks()
    assert {t.task_id for t in tasks.tasks} == set(ANSWERS)
    assert tasks.root == BUNDLED_PROJECT and (tasks.root / "VERSION").is_file()
    for task in tasks.tasks:
        right, wrong = ANSWERS[task.task_id]
        assert check_answer(task.check, right), task.task_id
        assert not check_answer(task.check, wrong), task.task_id


def _write(tmp_path: Path, *lines: object) -> Path:
    f = tmp_path / "tasks.jsonl"
    f.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines), "utf-8")
    return f


GOOD = {"id": "t", "prompt": "What is 2+2?", "tools": ["calc"], "check": {"number": 4}}


def test_a_users_task_file_with_its_own_project_root(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    f = _write(tmp_path, {"root": "proj"}, {**GOOD, "tenant": "acme", "max_steps": 2})
    tasks = load_tasks(f)
    assert tasks.root == (tmp_path / "proj").resolve()
    (task,) = tasks.tasks
    assert (task.tenant, task.max_steps, task.tools) == ("acme", 2, ("calc",))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "tasks.jsonl:1: not JSON"),
        ({**GOOD, "tools": ["shell"]}, "unknown tool"),
        ({k: v for k, v in GOOD.items() if k != "check"}, "needs check"),
        ({**GOOD, "max_steps": 0}, "max_steps"),
        ({**GOOD, "prompt": " "}, "prompt"),
        ({"root": "missing"}, "not a folder"),
    ],
)
def test_a_bad_task_file_names_the_line_at_fault(
    tmp_path: Path, line: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_tasks(_write(tmp_path, line, GOOD))


def test_task_ids_must_be_unique_and_a_file_needs_tasks(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unique"):
        load_tasks(_write(tmp_path, GOOD, GOOD))
    with pytest.raises(ConfigError, match="no tasks"):
        load_tasks(_write(tmp_path, ""))
    with pytest.raises(ConfigError, match="cannot read"):
        load_tasks(tmp_path / "absent.jsonl")
