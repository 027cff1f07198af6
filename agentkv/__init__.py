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
    "TenantIsolationError": "agentkv._errors",
    "ToolSchemaError": "agentkv._errors",
    "TraceFormatError": "agentkv._errors",
    "VLLMNotInstalledError": "agentkv._errors",
    # contract models
    "TrajectoryEvent": "agentkv.events._schema",
    "CacheAdvice": "agentkv.events._schema",
    # trajectory context and decorators
    "trajectory": "agentkv.events._context",
    "current_trajectory": "agentkv.events._context",
    "Trajectory": "agentkv.events._context",
    "model_call": "agentkv.events._context",
    "bind_context": "agentkv.events._context",
    "agent": "agentkv.events._decorators",
    "tool": "agentkv.events._decorators",
    "tool_call": "agentkv.events._decorators",
    # sinks and configuration
    "MemorySink": "agentkv.events._sinks",
    "JsonlSink": "agentkv.events._sinks",
    "CallbackSink": "agentkv.events._sinks",
    "OTelSink": "agentkv.events._otel",
    "configure": "agentkv.events._config",
    "flush": "agentkv.events._config",
    # prefix stabilization and cache identity
    "stable_tools": "agentkv.prefix._stable",
    "canonical_json": "agentkv.prefix._stable",
    "fingerprint": "agentkv.prefix._stable",
    "lint_prompt": "agentkv.prefix._lint",
    "LintFinding": "agentkv.prefix._lint",
    "CacheNamespace": "agentkv.prefix._namespace",
    "compute_block_hashes": "agentkv.prefix._blockhash",
    "matched_prefix_tokens": "agentkv.prefix._blockhash",
    "render_prompt": "agentkv.prefix._render",
    "RenderedPrompt": "agentkv.prefix._render",
    # gap learning
    "GapModel": "agentkv.gaps._model",
    "GapEstimate": "agentkv.gaps._model",
    "GapPrior": "agentkv.gaps._sketch",
    "GapRecord": "agentkv.gaps._store",
    # advice, client, accounting
    "Advisor": "agentkv.advice._advisor",
    "TrajectoryState": "agentkv.advice._advisor",
    "CostModel": "agentkv.advice._costmodel",
    "CostBreakdown": "agentkv.advice._costmodel",
    "LoadSnapshot": "agentkv.advice._costmodel",
    "kv_bytes_per_token": "agentkv.advice._kvsize",
    "wrap_openai": "agentkv.client._wrap",
    "unwrap_openai": "agentkv.client._wrap",
    "wrap_anthropic": "agentkv.client._wrap",
    "ClientOptions": "agentkv.client._options",
    "Affinity": "agentkv.client._affinity",
    "TurnRecord": "agentkv.client._accounting",
    "HintOutcome": "agentkv.client._accounting",
    "stats": "agentkv.client._accounting",
    "Stats": "agentkv.client._accounting",
    # server
    "serve": "agentkv.vllm._serve",
    "Server": "agentkv.vllm._launch",
    "ReplicaSet": "agentkv.vllm._replicas",
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
    # ``import X as X`` marks each name an explicit re-export (mypy --strict: no implicit re-export)
    from agentkv._errors import AgentKVError as AgentKVError
    from agentkv._errors import ConfigError as ConfigError
    from agentkv._errors import ServeError as ServeError
    from agentkv._errors import TenantIsolationError as TenantIsolationError
    from agentkv._errors import ToolSchemaError as ToolSchemaError
    from agentkv._errors import TraceFormatError as TraceFormatError
    from agentkv._errors import VLLMNotInstalledError as VLLMNotInstalledError
    from agentkv.advice._advisor import Advisor as Advisor
    from agentkv.advice._advisor import TrajectoryState as TrajectoryState
    from agentkv.advice._costmodel import CostBreakdown as CostBreakdown
    from agentkv.advice._costmodel import CostModel as CostModel
    from agentkv.advice._costmodel import LoadSnapshot as LoadSnapshot
    from agentkv.advice._kvsize import kv_bytes_per_token as kv_bytes_per_token
    from agentkv.client._accounting import HintOutcome as HintOutcome
    from agentkv.client._accounting import Stats as Stats
    from agentkv.client._accounting import TurnRecord as TurnRecord
    from agentkv.client._accounting import stats as stats
    from agentkv.client._affinity import Affinity as Affinity
    from agentkv.client._options import ClientOptions as ClientOptions
    from agentkv.client._wrap import unwrap_openai as unwrap_openai
    from agentkv.client._wrap import wrap_anthropic as wrap_anthropic
    from agentkv.client._wrap import wrap_openai as wrap_openai
    from agentkv.events._config import configure as configure
    from agentkv.events._config import flush as flush
    from agentkv.events._context import Trajectory as Trajectory
    from agentkv.events._context import bind_context as bind_context
    from agentkv.events._context import current_trajectory as current_trajectory
    from agentkv.events._context import model_call as model_call
    from agentkv.events._context import trajectory as trajectory
    from agentkv.events._decorators import agent as agent
    from agentkv.events._decorators import tool as tool
    from agentkv.events._decorators import tool_call as tool_call
    from agentkv.events._otel import OTelSink as OTelSink
    from agentkv.events._schema import CacheAdvice as CacheAdvice
    from agentkv.events._schema import TrajectoryEvent as TrajectoryEvent
    from agentkv.events._sinks import CallbackSink as CallbackSink
    from agentkv.events._sinks import JsonlSink as JsonlSink
    from agentkv.events._sinks import MemorySink as MemorySink
    from agentkv.gaps._model import GapEstimate as GapEstimate
    from agentkv.gaps._model import GapModel as GapModel
    from agentkv.gaps._sketch import GapPrior as GapPrior
    from agentkv.gaps._store import GapRecord as GapRecord
    from agentkv.prefix._blockhash import compute_block_hashes as compute_block_hashes
    from agentkv.prefix._blockhash import matched_prefix_tokens as matched_prefix_tokens
    from agentkv.prefix._lint import LintFinding as LintFinding
    from agentkv.prefix._lint import lint_prompt as lint_prompt
    from agentkv.prefix._namespace import CacheNamespace as CacheNamespace
    from agentkv.prefix._render import RenderedPrompt as RenderedPrompt
    from agentkv.prefix._render import render_prompt as render_prompt
    from agentkv.prefix._stable import canonical_json as canonical_json
    from agentkv.prefix._stable import fingerprint as fingerprint
    from agentkv.prefix._stable import stable_tools as stable_tools
    from agentkv.vllm._launch import Server as Server
    from agentkv.vllm._profile import ServeProfile as ServeProfile
    from agentkv.vllm._replicas import ReplicaSet as ReplicaSet
    from agentkv.vllm._serve import serve as serve
