"""agentkv: agent harnesses and the inference server cooperating on KV-cache residency.

The harness knows what the server cannot: which tool is running, how long it usually
takes, whether the trajectory is over. agentkv carries that knowledge across as
TrajectoryEvents and CacheAdvice, attaches hints to requests, and ships a vLLM profile
whose scheduler plugin honours them.

``import agentkv`` is light: openai, vllm, torch, transformers, langgraph and
opentelemetry are imported only by the features that need them. Public names
that live in heavier modules are resolved lazily on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentkv._version import __version__

# public name -> module that defines it (imported on first access)
_LAZY: dict[str, str] = {
    # errors
    "AgentKVError": "agentkv._errors",
    "ConfigError": "agentkv._errors",
    "ServeError": "agentkv._errors",
    "ToolSchemaError": "agentkv._errors",
    "TraceFormatError": "agentkv._errors",
    "VLLMNotInstalledError": "agentkv._errors",
    # contract models
    "TrajectoryEvent": "agentkv._models",
    "CacheAdvice": "agentkv._models",
    # trajectory context and decorators
    "trajectory": "agentkv._context",
    "current_trajectory": "agentkv._context",
    "Trajectory": "agentkv._context",
    "model_call": "agentkv._context",
    "bind_context": "agentkv._context",
    "agent": "agentkv._decorators",
    "tool": "agentkv._decorators",
    "tool_call": "agentkv._decorators",
    # sinks and configuration
    "MemorySink": "agentkv._sinks",
    "JsonlSink": "agentkv._sinks",
    "CallbackSink": "agentkv._sinks",
    "OTelSink": "agentkv._otel",
    "configure": "agentkv._config",
    "flush": "agentkv._config",
    # prefix stabilization and cache identity
    "stable_tools": "agentkv._stable",
    "canonical_json": "agentkv._stable",
    "fingerprint": "agentkv._stable",
    "lint_prompt": "agentkv._lint",
    "LintFinding": "agentkv._lint",
    "CacheNamespace": "agentkv._namespace",
    "compute_block_hashes": "agentkv._blockhash",
    "matched_prefix_tokens": "agentkv._blockhash",
    "render_prompt": "agentkv._render",
    "RenderedPrompt": "agentkv._render",
    # gap learning
    "GapModel": "agentkv._gaps",
    "GapEstimate": "agentkv._gaps",
    # advice, client, accounting
    "Advisor": "agentkv._advisor",
    "CostModel": "agentkv._costmodel",
    "kv_bytes_per_token": "agentkv._kvsize",
    "wrap_openai": "agentkv._client",
    "TurnRecord": "agentkv._accounting",
    "stats": "agentkv._accounting",
    # server
    "serve": "agentkv.vllm._launch",
    "Server": "agentkv.vllm._launch",
    "ServeProfile": "agentkv.vllm._profile",
}

__all__ = ["__version__", *sorted(_LAZY)]


# public submodules reachable as attributes (``agentkv.testing``) without an import
_SUBMODULES = frozenset({"testing"})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"agentkv.{name}")
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'agentkv' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # cache: later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from agentkv._accounting import TurnRecord, stats
    from agentkv._advisor import Advisor
    from agentkv._blockhash import compute_block_hashes, matched_prefix_tokens
    from agentkv._client import wrap_openai
    from agentkv._config import configure, flush
    from agentkv._context import (
        Trajectory,
        bind_context,
        current_trajectory,
        model_call,
        trajectory,
    )
    from agentkv._costmodel import CostModel
    from agentkv._decorators import agent, tool, tool_call
    from agentkv._errors import (
        AgentKVError,
        ConfigError,
        ServeError,
        ToolSchemaError,
        TraceFormatError,
        VLLMNotInstalledError,
    )
    from agentkv._gaps import GapEstimate, GapModel
    from agentkv._kvsize import kv_bytes_per_token
    from agentkv._lint import LintFinding, lint_prompt
    from agentkv._models import CacheAdvice, TrajectoryEvent
    from agentkv._namespace import CacheNamespace
    from agentkv._otel import OTelSink
    from agentkv._render import RenderedPrompt, render_prompt
    from agentkv._sinks import CallbackSink, JsonlSink, MemorySink
    from agentkv._stable import canonical_json, fingerprint, stable_tools
    from agentkv.vllm._launch import Server, serve
    from agentkv.vllm._profile import ServeProfile
