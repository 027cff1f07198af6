"""OpenTelemetry GenAI metrics, through ``opentelemetry-api`` meters.

Three histograms of the GenAI semantic conventions:

- ``gen_ai.execute_tool.duration`` (s): every tool execution agentkv sees (``@tool``,
  ``tool_call``, the integrations' tool calls), with ``gen_ai.tool.name``,
  ``agentkv.tool.class`` and ``error.type`` when the tool failed or was cancelled;
- ``gen_ai.client.operation.duration`` (s): every model call of a wrapped client;
- ``gen_ai.client.token.usage`` ({token}): its input and output tokens
  (``gen_ai.token.type``), when the server reported them.

Model-call metrics carry ``gen_ai.operation.name``, ``gen_ai.provider.name`` (the
backend's: ``vllm``, ``openai``, ``anthropic``, ...), the request and response models,
``server.address`` / ``server.port`` and ``error.type``.

Like the spans (:mod:`agentkv.events._otel`), this is a no-op until the application
configures a meter provider: agentkv uses the one given to
``agentkv.configure(meter_provider=...)``, else the API's global provider, and never
installs one. Without a given provider, ``opentelemetry.metrics`` must already be
imported (an application that never imported it cannot have configured a global
provider), so ``import agentkv`` and a process without OpenTelemetry pay nothing.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import Any

from agentkv._guard import internal_error
from agentkv._version import __version__

__all__ = [
    "get_meter_provider",
    "record_model_call",
    "record_tool",
    "set_meter_provider",
]

# Bucket boundaries the conventions advise.
_DURATION_BUCKETS_S = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
_TOKEN_BUCKETS = tuple(float(4**i) for i in range(14))  # 1 .. 67,108,864

_provider: Any = None  # None: the API's global provider
_instruments: tuple[Any, Any, Any] | None = None
_lock = threading.Lock()


def set_meter_provider(provider: Any) -> None:
    """Record agentkv's metrics on ``provider`` (None: the global provider)."""
    global _provider, _instruments
    with _lock:
        _provider = provider
        _instruments = None


def get_meter_provider() -> Any:
    """The provider set with :func:`set_meter_provider` (None: the global one)."""
    return _provider


def _histogram(meter: Any, name: str, unit: str, description: str, buckets: Any) -> Any:
    try:
        return meter.create_histogram(
            name, unit=unit, description=description, explicit_bucket_boundaries_advisory=buckets
        )
    except TypeError:  # an opentelemetry-api without bucket advice
        return meter.create_histogram(name, unit=unit, description=description)


def _get_instruments() -> tuple[Any, Any, Any] | None:
    """(tool duration, operation duration, token usage), or None without OpenTelemetry."""
    global _instruments
    found = _instruments
    if found is not None:
        return found
    if _provider is None and "opentelemetry.metrics" not in sys.modules:
        return None
    with _lock:
        if _instruments is None:
            from opentelemetry import metrics

            meter = metrics.get_meter("agentkv", __version__, meter_provider=_provider)
            _instruments = (
                _histogram(
                    meter,
                    "gen_ai.execute_tool.duration",
                    "s",
                    "Duration of tool executions",
                    _DURATION_BUCKETS_S,
                ),
                _histogram(
                    meter,
                    "gen_ai.client.operation.duration",
                    "s",
                    "GenAI operation duration",
                    _DURATION_BUCKETS_S,
                ),
                _histogram(
                    meter,
                    "gen_ai.client.token.usage",
                    "{token}",
                    "Number of input and output tokens used",
                    _TOKEN_BUCKETS,
                ),
            )
        return _instruments


def record_tool(tool_name: str, tool_class: str, duration_s: float, status: str) -> None:
    """Record one tool execution (``status``: ``ok``, ``error`` or ``cancelled``)."""
    instruments = _get_instruments()
    if instruments is None:
        return
    try:
        attrs = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool_name,
            "agentkv.tool.class": tool_class,
        }
        if status != "ok":
            attrs["error.type"] = "cancelled" if status == "cancelled" else "_OTHER"
        instruments[0].record(max(duration_s, 0.0), attrs)
    except Exception as exc:
        internal_error("tool duration metric", exc)


def record_model_call(
    attrs: Mapping[str, Any],
    duration_s: float,
    input_tokens: int | None,
    output_tokens: int | None,
) -> None:
    """Record one model call: its duration and, where known, its token counts."""
    instruments = _get_instruments()
    if instruments is None:
        return
    try:
        base = {k: v for k, v in attrs.items() if v is not None}
        instruments[1].record(max(duration_s, 0.0), base)
        usage = instruments[2]
        if input_tokens is not None:
            usage.record(input_tokens, {**base, "gen_ai.token.type": "input"})
        if output_tokens is not None:
            usage.record(output_tokens, {**base, "gen_ai.token.type": "output"})
    except Exception as exc:
        internal_error("model call metrics", exc)
