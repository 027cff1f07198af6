"""The live agent's tools, which really run, and the JSON schema of one agent step.

:class:`ToolBox` holds the tools over one project folder, each an ``@agentkv.tool``
(``agentkv.tool``, imported from its module; so its start, finish and gap are the
product's own events):

======================  ==========================================================
``list_files(path)``    the entries of a folder of the project
``read_file(path)``     a file's text (its first ``MAX_RESULT_CHARS`` characters)
``search(text)``        ``file:line: text`` for each line holding ``text``
``calc(expression)``    arithmetic (``+ - * / // % **`` and parentheses) on numbers
``run_tests()``         the project's recorded test report; it takes as long as a
                        shell tool of the bundled traces (:class:`GapSampler`)
======================  ==========================================================

:func:`step_schema` is what the server's structured outputs hold every answer to: one
JSON object, either a call of one of the task's tools (paths limited to the project's
own, expressions and search text to short plain strings) or the final answer. A small
model cannot then call a tool that does not exist or a file that is not there.
"""

from __future__ import annotations

import ast
import asyncio
import operator
import random
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from agentkv.events._decorators import tool

__all__ = [
    "MAX_RESULT_CHARS",
    "TOOL_NAMES",
    "GapSampler",
    "ToolBox",
    "compute_arithmetic",
    "step_schema",
    "tool_schemas",
]

MAX_RESULT_CHARS = 400
TOOL_NAMES = ("list_files", "read_file", "search", "calc", "run_tests")
ANSWER = "answer"

_EXPRESSION = r"^[0-9+*/%(). -]{1,40}$"
_SEARCH = r"^[A-Za-z0-9_.]{1,24}$"

_DESCRIPTIONS = {
    "list_files": ("List the entries of a folder of the project.", {"path": "folder"}),
    "read_file": ("Read a file of the project.", {"path": "file path"}),
    "search": ("Find the lines of the project's files that contain a text.", {"text": "text"}),
    "calc": ("Evaluate an arithmetic expression.", {"expression": "for example 3 * (4 + 5)"}),
    "run_tests": ("Run the project's test suite and report the result.", {}),
}

_OPS: dict[type, Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def compute_arithmetic(expression: str) -> float | int:
    """The value of ``expression`` (numbers, ``+ - * / // % **``, parentheses); raises
    ValueError for anything else, a zero division or an exponent above 100."""

    def ev(node: ast.AST) -> float | int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            if isinstance(node.value, bool):
                raise ValueError("not arithmetic: a boolean")
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 100:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)  # type: ignore[no-any-return]
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))  # type: ignore[no-any-return]
        raise ValueError(f"not arithmetic: {ast.dump(node)[:40]}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = ev(tree.body)
        return value
    except (SyntaxError, ZeroDivisionError, OverflowError, RecursionError) as exc:
        raise ValueError(str(exc) or type(exc).__name__) from exc


class GapSampler:
    """Run times drawn from the tool gaps of one tool of a trace (default: the shell tool
    of the bundled OpenHands traces), each capped at ``max_gap_s``; the draw for a key is
    the same in every process and every arm."""

    def __init__(
        self,
        gaps_s: Sequence[float] | None = None,
        *,
        tool_name: str = "execute_bash",
        max_gap_s: float = 3.0,
    ) -> None:
        if gaps_s is None:
            from agentkv._demo import demo_trace_path
            from agentkv.traces import load_trace

            trace = load_trace(demo_trace_path())
            gaps_s = [
                t.tool_gap_s
                for traj in trace.trajectories
                for t in traj.turns
                if t.tool_name == tool_name and t.tool_gap_s is not None
            ]
        self.gaps_s = sorted(max(0.0, float(g)) for g in gaps_s) or [0.0]
        self.max_gap_s = max_gap_s

    def draw_s(self, key: str) -> float:
        """The run time for ``key`` (a string seeds the draw)."""
        return min(random.Random(key).choice(self.gaps_s), self.max_gap_s)


def _project_paths(root: Path) -> tuple[list[str], list[str]]:
    files: list[str] = []
    folders = ["."]
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if any(part.startswith(".") or part == "__pycache__" for part in Path(rel).parts):
            continue
        (folders if p.is_dir() else files).append(rel)
    return files, folders


class ToolBox:
    """The tools over the project at ``root`` (see the module doc); ``gap_key`` names the
    run-time draw of :meth:`run_tests` (the task and repetition, so every arm waits as long)."""

    def __init__(self, root: Path, sampler: GapSampler | None = None) -> None:
        self.root = root.resolve()
        self.files, self.folders = _project_paths(self.root)
        self.sampler = sampler or GapSampler([0.0])
        self.gap_key = ""
        self._tools: dict[str, Callable[..., Awaitable[str]]] = {
            "list_files": tool(tool_class="file_read", name="list_files")(self._list_files),
            "read_file": tool(tool_class="file_read", name="read_file")(self._read_file),
            "search": tool(tool_class="search", name="search")(self._search),
            "calc": tool(tool_class="calc", name="calc")(self._calc),
            "run_tests": tool(tool_class="shell", name="run_tests")(self._run_tests),
        }

    def _inside(self, path: str) -> Path:
        p = (self.root / path).resolve()
        if p != self.root and self.root not in p.parents:
            raise ValueError(f"{path} is outside the project")
        return p

    async def _list_files(self, path: str = ".") -> str:
        p = self._inside(path)
        if not p.is_dir():
            return f"error: {path} is not a folder"
        names = sorted(
            c.name + ("/" if c.is_dir() else "")
            for c in p.iterdir()
            if not c.name.startswith(".") and c.name != "__pycache__"
        )
        return "\n".join(names)

    async def _read_file(self, path: str) -> str:
        p = self._inside(path)
        if not p.is_file():
            return f"error: no file {path}"
        return p.read_text("utf-8", errors="replace")[:MAX_RESULT_CHARS]

    async def _search(self, text: str) -> str:
        hits = []
        for rel in self.files:
            lines = (self.root / rel).read_text("utf-8", errors="replace").splitlines()
            hits += [
                f"{rel}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if text in line
            ]
        return "\n".join(hits[:5])[:MAX_RESULT_CHARS] or f"no line contains {text}"

    async def _calc(self, expression: str) -> str:
        try:
            value = compute_arithmetic(expression)
        except ValueError as exc:
            return f"error: {exc}"
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return str(value)

    async def _run_tests(self) -> str:
        await asyncio.sleep(self.sampler.draw_s(self.gap_key))
        report = self.root / ".run_tests.txt"
        return report.read_text("utf-8").strip() if report.is_file() else "no tests found"

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """Run tool ``name``; a tool's own error comes back as ``error: ...`` text."""
        fn = self._tools.get(name)
        if fn is None:
            return f"error: no tool {name}"
        try:
            return await fn(**arguments)
        except (TypeError, ValueError, OSError) as exc:
            return f"error: {exc}"


def tool_schemas(names: Sequence[str] = TOOL_NAMES) -> list[dict[str, Any]]:
    """The OpenAI tool definitions of ``names`` (the chat template renders them)."""
    out = []
    for name in names:
        text, params = _DESCRIPTIONS[name]
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": text,
                    "parameters": {
                        "type": "object",
                        "properties": {
                            k: {"type": "string", "description": v} for k, v in params.items()
                        },
                        "required": list(params),
                    },
                },
            }
        )
    return out


def _call_schema(name: str, box: ToolBox) -> dict[str, Any]:
    props: dict[str, Any] = {"tool": {"const": name}}
    if name == "list_files":
        props["path"] = {"enum": box.folders}
    elif name == "read_file":
        props["path"] = {"enum": box.files}
    elif name == "search":
        props["text"] = {"type": "string", "pattern": _SEARCH}
    elif name == "calc":
        props["expression"] = {"type": "string", "pattern": _EXPRESSION}
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def step_schema(tools: Sequence[str], box: ToolBox, max_answer_chars: int = 80) -> dict[str, Any]:
    """The JSON schema of one step: a call of one of ``tools`` or the final answer."""
    answer = {
        "type": "object",
        "properties": {
            "tool": {"const": ANSWER},
            "text": {"type": "string", "maxLength": max_answer_chars},
        },
        "required": ["tool", "text"],
        "additionalProperties": False,
    }
    return {"anyOf": [*(_call_schema(t, box) for t in tools), answer]}
