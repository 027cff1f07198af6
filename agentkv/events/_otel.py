"""OpenTelemetry: agentkv's tracer, and a sink turning events into spans.

Uses only ``opentelemetry-api`` (imported when a span is first recorded, not by
``import agentkv``) and never installs a global provider. agentkv's spans (the sink's
``invoke_agent`` / ``execute_tool`` spans and the client's ``chat`` spans) go to one
provider: the one given to ``agentkv.configure(tracer_provider=...)``, else the API's
global provider (a no-op until the application configures one). ``OTelSink`` may still
be given a provider of its own.
Attribute names follow the OpenTelemetry GenAI semantic conventions; agentkv's own data
goes under the ``agentkv.*`` prefix. No prompt, argument or result is recorded.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections import OrderedDict
from typing import Any

from agentkv._version import __version__
from agentkv.events import _pipeline
from agentkv.events._schema import TrajectoryEvent

__all__ = [
    "OTelSink",
    "enter_trajectory",
    "get_tracer",
    "get_tracer_provider",
    "leave_trajectory",
    "set_tracer_provider",
]

# GenAI semantic-convention attribute names (development stability; kept here as
# constants rather than imported from a package where they are deprecated).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
ERROR_TYPE = "error.type"

_provider: Any = None  # None: the API's global provider
_tracer: Any = None  # agentkv's tracer on _provider, made on first use


def set_tracer_provider(provider: Any) -> None:
    """Send agentkv's spans to ``provider`` (None: the global provider)."""
    global _provider, _tracer
    _provider = provider
    _tracer = None


def get_tracer_provider() -> Any:
    """The provider set with :func:`set_tracer_provider` (None: the global one)."""
    return _provider


def get_tracer() -> Any:
    """agentkv's tracer, or None while the application does not use OpenTelemetry.

    Without a configured provider, ``opentelemetry.trace`` must already be imported: an
    application that never imported it cannot have configured a global provider, so
    agentkv pays no import for it.
    """
    global _tracer
    if _provider is None and "opentelemetry.trace" not in sys.modules:
        return None
    if _tracer is None:
        from opentelemetry import trace

        _tracer = trace.get_tracer("agentkv", __version__, tracer_provider=_provider)
    return _tracer


def _configured_sink() -> OTelSink | None:
    for sink in _pipeline.get_sinks():
        if isinstance(sink, OTelSink):
            return sink
    return None


def note_provider(trajectory_id: str, provider_name: str) -> None:
    """Name the provider on a trajectory's ``invoke_agent`` span from its model calls
    (a client knows its backend; the sink does not), unless the sink was given one."""
    sink = _configured_sink()
    if sink is not None and sink.provider_name is None:
        sink.set_provider(trajectory_id, provider_name)


def enter_trajectory(traj: Any) -> Any:
    """Make ``traj``'s ``invoke_agent`` span current (opening it); a token, or None.

    Only while an :class:`OTelSink` is configured (the sink owns and ends the span at
    ``trajectory_finished``). The client's ``chat`` spans and the sink's
    ``execute_tool`` spans started meanwhile are its children. Undo with
    :func:`leave_trajectory` in the same context.
    """
    sink = _configured_sink()
    if sink is None:
        return None
    from opentelemetry import context, trace

    span = sink.agent_span(traj)
    return context.attach(trace.set_span_in_context(span))


def leave_trajectory(token: Any) -> None:
    """Undo :func:`enter_trajectory` (a None token is ignored)."""
    if token is None:
        return
    from opentelemetry import context

    with contextlib.suppress(Exception):  # detached elsewhere: nothing of ours to restore
        context.detach(token)


class OTelSink:
    """Turn agentkv events into OpenTelemetry spans.

    One ``invoke_agent`` span per trajectory (opened when the trajectory starts, or at
    its first event; closed at ``trajectory_finished`` / ``trajectory_cancelled``), with
    one child ``execute_tool`` span per tool call (``gen_ai.tool.call.id`` where the
    framework gave one). While the trajectory runs its span is the current span, so the
    client's ``chat`` spans are its children too. Subagent spans are children of their
    parent's span. ``gen_ai.agent.name`` is the trajectory's ``metadata["agent_name"]``
    (integrations set it), else ``agent_name``.
    ``max_open_trajectories`` bounds memory: beyond it the oldest open span is ended.
    ``tracer_provider`` defaults to the one given to ``agentkv.configure`` (when the
    span starts), else the global provider. ``gen_ai.provider.name`` on an
    ``invoke_agent`` span is ``provider_name`` when given, else the provider of the
    trajectory's model calls through a wrapped client (``vllm``, ``openai``,
    ``anthropic``, ...), set at its first call.
    """

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        provider_name: str | None = None,
        agent_name: str | None = None,
        max_open_trajectories: int = 10_000,
    ) -> None:
        from opentelemetry import trace

        self._trace = trace
        # With a provider of its own the sink keeps its tracer; else it asks on every span,
        # so configure(tracer_provider=...) applies even to a sink made before the call.
        self._own_tracer = (
            trace.get_tracer("agentkv", __version__, tracer_provider=tracer_provider)
            if tracer_provider is not None
            else None
        )
        self.provider_name = provider_name
        self.agent_name = agent_name
        self.max_open = max_open_trajectories
        self._agents: OrderedDict[str, Any] = OrderedDict()
        self._tools: dict[tuple[str, str], list[Any]] = {}
        self._lock = threading.Lock()

    def _tracer(self) -> Any:
        return self._own_tracer if self._own_tracer is not None else get_tracer()

    def _agent_span(self, event: TrajectoryEvent) -> Any:
        return self._open(event.trajectory_id, event.parent_trajectory_id, event.tenant)

    def agent_span(self, traj: Any) -> Any:
        """The ``invoke_agent`` span of a live trajectory (opened now if need be)."""
        name = traj.metadata.get("agent_name")
        with self._lock:
            return self._open(
                traj.trajectory_id,
                traj.parent_id,
                traj.tenant,
                agent_name=name if isinstance(name, str) and name else None,
            )

    def _open(
        self,
        trajectory_id: str,
        parent_id: str | None,
        tenant: str | None,
        agent_name: str | None = None,
    ) -> Any:
        span = self._agents.get(trajectory_id)
        if span is not None:
            return span
        parent_ctx = None
        if parent_id is not None:
            # A subagent may report before its parent has: open the parent's span now.
            parent_ctx = self._trace.set_span_in_context(self._open(parent_id, None, tenant))
        agent_name = agent_name or self.agent_name
        name = f"invoke_agent {agent_name}" if agent_name else "invoke_agent"
        attrs: dict[str, Any] = {
            GEN_AI_OPERATION_NAME: "invoke_agent",
            GEN_AI_CONVERSATION_ID: trajectory_id,
            "agentkv.trajectory.id": trajectory_id,
        }
        if self.provider_name is not None:
            attrs[GEN_AI_PROVIDER_NAME] = self.provider_name
        if agent_name:
            attrs[GEN_AI_AGENT_NAME] = agent_name
        if parent_id:
            attrs["agentkv.trajectory.parent_id"] = parent_id
        if tenant:
            attrs["agentkv.tenant"] = tenant
        span = self._tracer().start_span(name, context=parent_ctx, attributes=attrs)
        self._agents[trajectory_id] = span
        while len(self._agents) > self.max_open:
            _, old = self._agents.popitem(last=False)
            old.end()
        return span

    def set_provider(self, trajectory_id: str, provider_name: str) -> None:
        """Set ``gen_ai.provider.name`` on a live trajectory's ``invoke_agent`` span."""
        with self._lock:
            span = self._agents.get(trajectory_id)
            if span is not None:
                span.set_attribute(GEN_AI_PROVIDER_NAME, provider_name)

    def emit(self, event: TrajectoryEvent) -> None:
        """Open or close the spans this event stands for."""
        with self._lock:
            kind = event.event
            agent = self._agent_span(event)
            if kind == "model_started":
                turn = event.turn_number
                if turn is not None:
                    agent.set_attribute("agentkv.turns", turn + 1)
            elif kind == "tool_started":
                name = event.tool_name or event.tool_class or "tool"
                attrs: dict[str, Any] = {
                    GEN_AI_OPERATION_NAME: "execute_tool",
                    GEN_AI_TOOL_NAME: name,
                    GEN_AI_TOOL_TYPE: "function",
                    "agentkv.tool.class": event.tool_class or name,
                    "agentkv.turn.id": event.turn_id,
                }
                if event.tool_call_id:
                    attrs[GEN_AI_TOOL_CALL_ID] = event.tool_call_id
                span = self._tracer().start_span(
                    f"execute_tool {name}",
                    context=self._trace.set_span_in_context(agent),
                    attributes=attrs,
                )
                key = (event.trajectory_id, event.tool_call_id or name)
                self._tools.setdefault(key, []).append(span)
            elif kind == "tool_finished":
                key = (
                    event.trajectory_id,
                    event.tool_call_id or event.tool_name or event.tool_class or "tool",
                )
                stack = self._tools.get(key)
                if stack:
                    span = stack.pop(0)
                    if not stack:
                        del self._tools[key]
                    self._finish(span, event.status)
            elif kind in ("trajectory_finished", "trajectory_cancelled"):
                self._agents.pop(event.trajectory_id, None)
                for key in [k for k in self._tools if k[0] == event.trajectory_id]:
                    for span in self._tools.pop(key):
                        self._finish(span, "cancelled")
                self._finish(agent, event.status)

    def _finish(self, span: Any, status: str | None) -> None:
        if status in ("error", "cancelled"):
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute(ERROR_TYPE, "cancelled" if status == "cancelled" else "_OTHER")
            span.set_status(Status(StatusCode.ERROR))
        span.end()

    def close(self) -> None:
        """End every span still open."""
        with self._lock:
            for stack in self._tools.values():
                for span in stack:
                    span.end()
            self._tools.clear()
            for span in self._agents.values():
                span.end()
            self._agents.clear()
