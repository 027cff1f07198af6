"""OpenTelemetry sink: trajectories as ``invoke_agent`` spans, tools as ``execute_tool`` spans.

Uses only ``opentelemetry-api`` (imported when the sink is created, not by
``import agentkv``) and never installs a global provider: pass ``tracer_provider`` or
let the API's global provider (a no-op until the application configures one) decide.
Attribute names follow the OpenTelemetry GenAI semantic conventions; agentkv's own data
goes under the ``agentkv.*`` prefix. No prompt, argument or result is recorded.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from agentkv._version import __version__
from agentkv.events._schema import TrajectoryEvent

__all__ = ["OTelSink"]

# GenAI semantic-convention attribute names (development stability; kept here as
# constants rather than imported from a package where they are deprecated).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
ERROR_TYPE = "error.type"


class OTelSink:
    """Turn agentkv events into OpenTelemetry spans.

    One ``invoke_agent`` span per trajectory (opened at its first event, closed at
    ``trajectory_finished`` / ``trajectory_cancelled``), with one child ``execute_tool``
    span per tool call. Subagent spans are children of their parent's span.
    ``max_open_trajectories`` bounds memory: beyond it the oldest open span is ended.
    """

    def __init__(
        self,
        *,
        tracer_provider: Any = None,
        provider_name: str = "vllm",
        agent_name: str | None = None,
        max_open_trajectories: int = 10_000,
    ) -> None:
        from opentelemetry import trace

        self._trace = trace
        self._tracer = trace.get_tracer("agentkv", __version__, tracer_provider=tracer_provider)
        self.provider_name = provider_name
        self.agent_name = agent_name
        self.max_open = max_open_trajectories
        self._agents: OrderedDict[str, Any] = OrderedDict()
        self._tools: dict[tuple[str, str], list[Any]] = {}
        self._lock = threading.Lock()

    def _agent_span(self, event: TrajectoryEvent) -> Any:
        return self._open(event.trajectory_id, event.parent_trajectory_id, event.tenant)

    def _open(self, trajectory_id: str, parent_id: str | None, tenant: str | None) -> Any:
        span = self._agents.get(trajectory_id)
        if span is not None:
            return span
        parent_ctx = None
        if parent_id is not None:
            # A subagent may report before its parent has: open the parent's span now.
            parent_ctx = self._trace.set_span_in_context(self._open(parent_id, None, tenant))
        name = f"invoke_agent {self.agent_name}" if self.agent_name else "invoke_agent"
        attrs: dict[str, Any] = {
            GEN_AI_OPERATION_NAME: "invoke_agent",
            GEN_AI_PROVIDER_NAME: self.provider_name,
            GEN_AI_CONVERSATION_ID: trajectory_id,
            "agentkv.trajectory.id": trajectory_id,
        }
        if self.agent_name:
            attrs[GEN_AI_AGENT_NAME] = self.agent_name
        if parent_id:
            attrs["agentkv.trajectory.parent_id"] = parent_id
        if tenant:
            attrs["agentkv.tenant"] = tenant
        span = self._tracer.start_span(name, context=parent_ctx, attributes=attrs)
        self._agents[trajectory_id] = span
        while len(self._agents) > self.max_open:
            _, old = self._agents.popitem(last=False)
            old.end()
        return span

    def emit(self, event: TrajectoryEvent) -> None:
        """Open or close the spans this event stands for."""
        with self._lock:
            kind = event.event
            agent = self._agent_span(event)
            if kind == "model_started":
                agent.set_attribute("agentkv.turns", event.turn_id + 1)
            elif kind == "tool_started":
                name = event.tool_name or event.tool_class or "tool"
                span = self._tracer.start_span(
                    f"execute_tool {name}",
                    context=self._trace.set_span_in_context(agent),
                    attributes={
                        GEN_AI_OPERATION_NAME: "execute_tool",
                        GEN_AI_TOOL_NAME: name,
                        GEN_AI_TOOL_TYPE: "function",
                        "agentkv.tool.class": event.tool_class or name,
                        "agentkv.turn.id": event.turn_id,
                    },
                )
                self._tools.setdefault((event.trajectory_id, name), []).append(span)
            elif kind == "tool_finished":
                name = event.tool_name or event.tool_class or "tool"
                stack = self._tools.get((event.trajectory_id, name))
                if stack:
                    span = stack.pop(0)
                    if not stack:
                        del self._tools[(event.trajectory_id, name)]
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
