"""Package surface: the public API list, lazy imports, the CLI entry points."""

from __future__ import annotations

import subprocess
import sys

import agentkv

HEAVY = ["openai", "vllm", "torch", "transformers", "langgraph", "opentelemetry", "numpy"]

#: The public API, exactly: a name added or removed must be added or removed here too.
PUBLIC_NAMES = [
    "__version__",
    "Advisor",
    "Affinity",
    "AgentKVError",
    "CacheAdvice",
    "CacheNamespace",
    "CallbackSink",
    "ClientOptions",
    "ConfigError",
    "CostBreakdown",
    "CostModel",
    "GapEstimate",
    "GapModel",
    "GapPrior",
    "GapRecord",
    "HintOutcome",
    "JsonlSink",
    "LintFinding",
    "LoadSnapshot",
    "MemorySink",
    "OTelSink",
    "RenderedPrompt",
    "ReplicaSet",
    "ServeError",
    "ServeProfile",
    "Server",
    "Stats",
    "TenantIsolationError",
    "ToolSchemaError",
    "TraceFormatError",
    "Trajectory",
    "TrajectoryEvent",
    "TrajectoryState",
    "TurnRecord",
    "VLLMNotInstalledError",
    "agent",
    "bind_context",
    "canonical_json",
    "compute_block_hashes",
    "configure",
    "current_trajectory",
    "fingerprint",
    "flush",
    "kv_bytes_per_token",
    "lint_prompt",
    "matched_prefix_tokens",
    "model_call",
    "render_prompt",
    "serve",
    "stable_tools",
    "stats",
    "tool",
    "tool_call",
    "trajectory",
    "unwrap_openai",
    "wrap_anthropic",
    "wrap_openai",
]


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


def test_all_is_exactly_the_public_api_and_each_name_resolves() -> None:
    assert agentkv.__all__ == PUBLIC_NAMES
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


def test_testing_helpers_are_an_attribute_of_agentkv_without_an_import() -> None:
    code = (
        "import agentkv\nprint(agentkv.testing.capture_events.__name__, 'testing' in dir(agentkv))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["capture_events", "True"]
