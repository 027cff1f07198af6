"""Typing surface: ``mypy --strict`` on a user's file accepts every public name.

Under ``--strict`` mypy turns off implicit re-exports: a name a package imports from a
private module counts as exported only when written ``import X as X`` or listed in a literal
``__all__``. The user file below imports every public name the way a user would, and
uses a few of them so their types are checked too.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Public modules whose ``__all__`` a user imports from.
PUBLIC_MODULES = [
    "agentkv",
    "agentkv.testing",
    "agentkv.traces",
    "agentkv.vllm",
    "agentkv.sim",
    "agentkv.models",
    "agentkv.residency",
    "agentkv.workload",
    "agentkv.integrations.langgraph",
    "agentkv.integrations.openai_agents",
]

USES = """
import agentkv
from agentkv.testing import capture_events


def run() -> int:
    event: agentkv.TrajectoryEvent
    with capture_events() as events, agentkv.trajectory(tenant="acme") as traj:
        tools = agentkv.stable_tools([])
        name: str = traj.trajectory_id
        del name, tools
    event = events[0]
    profile = agentkv.ServeProfile(model="m")
    del profile
    return len(event.trajectory_id)
"""


def _user_file() -> str:
    lines = []
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        alias = module_name.replace(".", "_")
        for name in module.__all__:
            lines.append(f"from {module_name} import {name} as _{alias}_{name}")
            if module_name == "agentkv":
                lines.append(f"_{alias}_attr_{name} = agentkv.{name}")
    return "import agentkv\n" + "\n".join(lines) + "\n" + USES


@pytest.mark.slow
def test_mypy_strict_accepts_every_public_name_in_a_user_file(tmp_path: Path) -> None:
    """Every name in each public module's ``__all__`` imports and resolves under --strict."""
    user = tmp_path / "user_code.py"
    user.write_text(_user_file())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--config-file",
            "",
            str(user),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success" in proc.stdout
