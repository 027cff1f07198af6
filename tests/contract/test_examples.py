"""Every example in examples/ runs to completion (``python examples/NAME.py``).

Examples that need a server are marked ``server`` and run against the session's shared
``smollm2_server`` (the embedded real model they default to, passed as
``AGENTKV_BASE_URL``), so the suite starts no extra server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NO_SERVER = ["hosted_api.py"]
WITH_SERVER = [
    "custom_harness.py",
    "custom_harness_threads.py",
    "custom_harness_async.py",
    "langgraph_agent.py",
    "multi_agent.py",
    "replay_own_runs.py",
]


def _run(name: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / name)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        cwd=EXAMPLES.parent,
    )
    assert out.returncode == 0, f"{name} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def test_every_example_is_listed() -> None:
    """A new example must be added to one of the lists above (so it runs in the suite)."""
    found = {p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")}
    assert found == set(NO_SERVER) | set(WITH_SERVER)


def test_hosted_api_example_shows_the_cache_key_without_network() -> None:
    """hosted_api.py prints prompt_cache_key (one per family) and the 24h retention."""
    out = _run("hosted_api.py")
    assert '"prompt_cache_key": "akv-' in out
    assert '"prompt_cache_retention": "24h"' in out
    assert "one cache key for the whole family: True" in out


@pytest.fixture
def server_env(smollm2_server: Any) -> dict[str, str]:
    """AGENTKV_BASE_URL / AGENTKV_MODEL of the session's shared SmolLM2 server."""
    return {"AGENTKV_BASE_URL": smollm2_server.base_url, "AGENTKV_MODEL": smollm2_server.model}


EXPECT = {
    "custom_harness.py": ["model decisions:", "trajectory_finished", "prefix_reuse_ratio:"],
    "custom_harness_threads.py": [
        "thread-agent-2: 3 turns, 6 tool calls, last=trajectory_finished"
    ],
    "custom_harness_async.py": ["async-agent-2: 3 turns, 6 tool calls, last=trajectory_finished"],
    "langgraph_agent.py": ["langgraph-demo-1  turn 3  trajectory_finished", "file_read"],
    "multi_agent.py": ["parent=planner-1", "critical_path", "used): prefetch (next_step_known)"],
    "replay_own_runs.py": ["3 trajectories, 12 turns", "agentkv bench --trace"],
}


@pytest.mark.server
@pytest.mark.parametrize("name", WITH_SERVER)
def test_server_example_runs(name: str, server_env: dict[str, str]) -> None:
    """The example runs against the shared SmolLM2 server and prints what it promises."""
    out = _run(name, server_env)
    for text in EXPECT[name]:
        assert text in out, f"{name}: {text!r} not in output:\n{out[-3000:]}"
