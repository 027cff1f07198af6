"""A client SDK's own span of a call: one ``chat`` span per call, not two.

The ``anthropic`` SDK (2.x) traces its calls itself: each ``messages.create`` (and
``stream``) has one ``CLIENT`` span, scope ``com.anthropic.sdk.python``, with the
request, usage (cache reads and writes) and time to first chunk. agentkv's wrapper sits
outside that span (it hooks ``client.request``, and the SDK starts its span inside it),
so a chat span of agentkv's own would be a second span of the same call and count every
token twice in cost views. When the SDK traces to the provider agentkv uses, agentkv
makes no span of its own and adds its attributes (``agentkv.*``, the conversation id) to
the SDK's, which it finds while that span is current:

- a parsed answer: in the request's ``post_parser`` (which the SDK runs while parsing,
  before it ends the span), where the call is also finished;
- a stream: when the SDK makes the stream object (inside the span), the call finished
  at ``message_stop``, before the SDK ends the span with the body.

A raw response parsed later by the caller finds no span current: it keeps the SDK's
attributes alone. Which provider the SDK traces to is its client option
``open_telemetry={"tracer_provider": ...}`` (else the global provider).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["SDK_SCOPES", "current_sdk_span", "sdk_traces_here"]

#: Instrumentation scopes of SDKs that make the chat span of their own calls.
SDK_SCOPES = frozenset({"com.anthropic.sdk.python"})


def sdk_traces_here(client: Any, agentkv_provider: Any) -> bool:
    """Whether ``client`` (an ``anthropic`` client) traces its calls to the provider
    agentkv's spans go to (``agentkv_provider``; None: the global one)."""
    if not type(client).__module__.startswith("anthropic"):
        return False
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return False
    options = getattr(client, "_open_telemetry", None)
    if not isinstance(options, dict) or not (options.get("traces") or {}).get("enabled"):
        return False
    if getattr(client, "_tracer", None) is None:  # the SDK's own switch (None: no spans)
        return False
    global_provider = trace.get_tracer_provider()
    theirs = options.get("tracer_provider") or global_provider
    ours = agentkv_provider or global_provider
    return theirs is ours


def current_sdk_span() -> Any:
    """The current span when it is a recording call span of an SDK in :data:`SDK_SCOPES`."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    span = trace.get_current_span()
    scope = getattr(span, "instrumentation_scope", None)
    if getattr(scope, "name", None) not in SDK_SCOPES or not span.is_recording():
        return None
    return span
