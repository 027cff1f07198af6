"""Package surface: the public API list, lazy imports, the CLI entry points."""

from __future__ import annotations

import subprocess
import sys

import agentkv

HEAVY = ["openai", "vllm", "torch", "transformers", "langgraph", "opentelemetry", "numpy"]

FIXED_PUBLIC_NAMES = {
    "tool",
    "tool_call",
    "trajectory",
    "agent",
    "current_trajectory",
    "TrajectoryEvent",
    "CacheAdvice",
    "MemorySink",
    "JsonlSink",
    "configure",
    "stable_tools",
    "canonical_json",
    "lint_prompt",
    "CacheNamespace",
    "compute_block_hashes",
    "matched_prefix_tokens",
    "GapModel",
    "GapEstimate",
    "wrap_openai",
    "Advisor",
    "kv_bytes_per_token",
    "TurnRecord",
    "stats",
    "serve",
    "ServeProfile",
}


def test_import_agentkv_does_not_import_heavy_dependencies() -> None:
    code = (
        "import sys, agentkv\n"
        "import agentkv.testing\n"
        "@agentkv.tool\n"
        "def f(): return 1\n"
        "with agentkv.trajectory(): f()\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_all_lists_the_fixed_public_names_and_each_resolves() -> None:
    assert set(agentkv.__all__) >= FIXED_PUBLIC_NAMES
    for name in agentkv.__all__:
        assert getattr(agentkv, name) is not None, name
        obj = getattr(agentkv, name)
        if callable(obj) and not isinstance(obj, str):
            assert obj.__doc__, f"agentkv.{name} has no docstring"


def test_unknown_attribute_raises_attribute_error() -> None:
    import pytest

    with pytest.raises(AttributeError):
        agentkv.no_such_thing  # noqa: B018


def test_cli_help_and_version() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentkv", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("demo", "bench", "sim", "serve", "lint", "gaps"):
        assert command in out.stdout
    ver = subprocess.run(
        [sys.executable, "-m", "agentkv", "--version"], capture_output=True, text=True, check=True
    )
    assert agentkv.__version__ in ver.stdout
