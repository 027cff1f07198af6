"""Durable-thread tests: each phase of a LangGraph run in a fresh Python process that
shares only a file-backed checkpointer with the others.

The parent test calls :func:`run_phase` with a phase program; the program (run with
``python -c``) builds its graph from :func:`file_saver`, :func:`tools` and
:data:`SCRIPTS`, and ends with :func:`report`. LangGraph is imported only inside the
phase process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["ROOT", "SCRIPTS", "file_saver", "report", "run_phase", "tools"]

ROOT = Path(__file__).resolve().parents[2]

#: The scripted model's answers per phase: a thread's first run (a tool call, then an
#: answer), its second run, a run interrupted in a tool, and that run resumed.
SCRIPTS: dict[str, list[Any]] = {
    "first": [[("grep", {"pattern": "a"})], "first answer"],
    "second": ["second answer"],
    "interrupted": [[("ask_user", {"question": "which file?"})]],
    "resumed": ["thanks"],
}


def file_saver(folder: str) -> Any:
    """LangGraph's ``InMemorySaver`` backed by files in ``folder`` (its ``PersistentDict``
    factory), loading what an earlier phase wrote there."""
    from langgraph.checkpoint.memory import InMemorySaver, PersistentDict

    names = iter(("storage", "writes", "blobs"))

    def factory(*args: Any) -> Any:
        d = PersistentDict(*args, filename=os.path.join(folder, next(names)))
        if os.path.exists(d.filename):
            d.load()
        return d

    return InMemorySaver(factory=factory)


def tools() -> list[Any]:
    """The phases' tools: ``grep`` answers, ``ask_user`` interrupts the graph."""
    from langchain_core.tools import tool
    from langgraph.types import interrupt

    @tool
    def grep(pattern: str) -> str:
        """Search the code for a pattern."""
        return "3 matches"

    @tool
    def ask_user(question: str) -> str:
        """Ask the user."""
        return str(interrupt(question))

    return [grep, ask_user]


def report(events: Iterable[Any], xargs: Iterable[dict[str, Any]]) -> None:
    """Print what the parent reads: the captured events and each call's turn id."""
    print(
        json.dumps(
            {
                "events": [[e.trajectory_id, e.turn_id, e.event, e.tool_class] for e in events],
                "turns": [x.get("agentkv_turnId") for x in xargs],
            }
        )
    )


def run_phase(program: str, *args: str) -> dict[str, list[object]]:
    """Run one phase program in a fresh process; its :func:`report`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, list[object]] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out
