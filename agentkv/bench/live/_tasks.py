"""Live-agent tasks: a prompt, the tools it may use, and a checker of the final answer.

A task file is JSON Lines, one task a line::

    {"id": "calc-product", "prompt": "What is 17 * 23? ...", "tools": ["calc"],
     "check": {"number": 391}, "tenant": "math", "max_steps": 4}

``tools`` names tools of :mod:`agentkv.bench.live._tools`; ``check`` is one checker:

- ``{"number": N}``: the answer states N: one of its numbers equals N (``17 * 23 = 391``,
  ``port 8080 with 3 workers``; thousands commas and a trailing ``.0`` are ignored, and
  ``18080`` is not ``8080``);
- ``{"contains": [s, ...]}``: the answer contains one of the strings (case-insensitive);
- ``{"contains_all": [s, ...]}``: the answer contains every string (case-insensitive).

``tenant`` (default ``"live"``) groups tasks for the worst-tenant figures; ``max_steps``
overrides the run's step limit. A line ``{"root": "DIR"}`` before the tasks names the
project their file tools read (relative to the task file); the default is the bundled
project. The bundled tasks lie in ``agentkv/bench/data/live/tasks.jsonl``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError

__all__ = [
    "BUNDLED_PROJECT",
    "BUNDLED_TASKS",
    "CHECK_KINDS",
    "Task",
    "TaskSet",
    "check_answer",
    "load_tasks",
    "parse_check",
]

_DATA = Path(__file__).resolve().parent.parent / "data" / "live"
#: The bundled tasks and the small project their file tools read.
BUNDLED_TASKS = _DATA / "tasks.jsonl"
BUNDLED_PROJECT = _DATA / "project"

CHECK_KINDS = ("number", "contains", "contains_all")

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass(frozen=True, slots=True)
class Task:
    """One live task: what the agent is asked, with which tools, and how it is judged."""

    task_id: str
    prompt: str
    tools: tuple[str, ...]
    check: Mapping[str, Any]
    tenant: str = "live"
    max_steps: int | None = None


@dataclass(frozen=True, slots=True)
class TaskSet:
    """The tasks of one file and the project their file tools read."""

    tasks: tuple[Task, ...]
    root: Path
    source: str
    extra: dict[str, Any] = field(default_factory=dict)


def parse_check(raw: Any, where: str) -> dict[str, Any]:
    """Validate one checker (see the module doc); raise :class:`ConfigError` if bad."""
    if not isinstance(raw, dict) or len(raw) != 1:
        raise ConfigError(f"{where}: 'check' must be one of {{{', '.join(CHECK_KINDS)}: ...}}")
    kind, value = next(iter(raw.items()))
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: check 'number' needs a number, got {value!r}")
    elif kind in ("contains", "contains_all"):
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(s, str) and s for s in value)
        ):
            raise ConfigError(f"{where}: check {kind!r} needs a list of non-empty strings")
    else:
        raise ConfigError(f"{where}: unknown check {kind!r}: choose from {', '.join(CHECK_KINDS)}")
    return {kind: value}


def _numbers(text: str) -> list[float]:
    out = []
    for raw in _NUMBER.findall(text):
        try:
            out.append(float(raw.rstrip(",").replace(",", "")))
        except ValueError:
            continue
    return out


def check_answer(check: Mapping[str, Any], answer: str | None) -> bool:
    """Whether ``answer`` (None: the agent gave none) passes ``check``."""
    if answer is None:
        return False
    kind, value = next(iter(check.items()))
    if kind == "number":
        return any(abs(got - float(value)) < 1e-9 for got in _numbers(answer))
    low = answer.lower()
    hits = [s.lower() in low for s in value]
    return all(hits) if kind == "contains_all" else any(hits)


def _task(raw: Any, where: str, known_tools: Sequence[str]) -> Task:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a task is a JSON object")
    missing = [k for k in ("id", "prompt", "tools", "check") if k not in raw]
    if missing:
        raise ConfigError(f"{where}: a task needs {', '.join(missing)}")
    tools = raw["tools"]
    if not isinstance(tools, list) or not tools or not all(isinstance(t, str) for t in tools):
        raise ConfigError(f"{where}: 'tools' must be a non-empty list of tool names")
    unknown = [t for t in tools if t not in known_tools]
    if unknown:
        raise ConfigError(
            f"{where}: unknown tool(s) {', '.join(unknown)}: choose from {', '.join(known_tools)}"
        )
    steps = raw.get("max_steps")
    if steps is not None and (not isinstance(steps, int) or steps < 1):
        raise ConfigError(f"{where}: 'max_steps' must be a positive integer")
    if not isinstance(raw["prompt"], str) or not raw["prompt"].strip():
        raise ConfigError(f"{where}: 'prompt' must be a non-empty string")
    return Task(
        task_id=str(raw["id"]),
        prompt=raw["prompt"],
        tools=tuple(dict.fromkeys(tools)),
        check=parse_check(raw["check"], where),
        tenant=str(raw.get("tenant", "live")),
        max_steps=steps,
    )


def load_tasks(path: str | Path | None = None) -> TaskSet:
    """The tasks of ``path`` (None: the bundled tasks); raise :class:`ConfigError` with
    the line at fault when the file is not a valid task file."""
    from agentkv.bench.live._tools import TOOL_NAMES

    file = Path(path) if path is not None else BUNDLED_TASKS
    try:
        lines = file.read_text("utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the task file {file}: {exc}") from exc
    root = BUNDLED_PROJECT
    tasks: list[Task] = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{file}:{no}"
        try:
            raw = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{where}: not JSON ({exc})") from exc
        if isinstance(raw, dict) and set(raw) == {"root"}:
            root = (file.parent / str(raw["root"])).resolve()
            if not root.is_dir():
                raise ConfigError(f"{where}: the project root {root} is not a folder")
            continue
        tasks.append(_task(raw, where, TOOL_NAMES))
    if not tasks:
        raise ConfigError(f"{file}: no tasks")
    ids = [t.task_id for t in tasks]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"{file}: task ids must be unique ({', '.join(dupes)})")
    return TaskSet(tuple(tasks), root, str(file))
