"""OpenAI Agents SDK integration: a tracing processor (one line) and run hooks.

The tracing processor is the complete adapter::

    import agents
    from agentkv.integrations.openai_agents import AgentKVTracingProcessor

    agents.add_trace_processor(AgentKVTracingProcessor(tool_classes={"grep": "search"}))
    client = agentkv.wrap_openai(AsyncOpenAI(base_url=...))      # hints on model calls
    model = OpenAIChatCompletionsModel(model=M, openai_client=client)
    await Runner.run(agent, "hi", run_config=RunConfig(group_id="thread-1"))

The mapping is the same as LangGraph's:

- a run's trace is a trajectory: its id is the trace's ``group_id`` (the SDK's
  conversation or thread id), else the ``trace_id``; the trajectory is current for the
  whole run (the wrapped client and ``@agentkv.tool`` functions see it) and ends with the
  trace (``trajectory_finished``; status ``error`` or ``trajectory_cancelled`` when the
  run raised). A trajectory you opened yourself around ``Runner.run`` is used as is;
- each function-tool span is a tool event pair with its class (``tool_classes``);
  set ``tool_events=False`` when the tools are already ``@agentkv.tool``-decorated;
- an agent run from inside a tool call (``agent.as_tool()``) is a child trajectory;
- model turns come from the wrapped client; with an unwrapped client set
  ``model_events=True`` so each generation or response span advances the turn.

Tracing must be on (it is by default; ``set_tracing_disabled(True)`` or
``OPENAI_AGENTS_DISABLE_TRACING=1`` turn the processor off). Use
``agents.set_trace_processors([...])`` instead of ``add_trace_processor`` to drop the
default exporter to OpenAI's servers.

:class:`AgentKVRunHooks` gives the tool and model mapping through ``Runner.run(...,
hooks=...)`` for runs inside a trajectory you open (hooks run in their own tasks, so
they cannot open one that the run's model calls would see).
"""

from __future__ import annotations

import contextvars
import sys
import threading
from contextlib import suppress
from typing import Any

from agentkv._guard import internal_error, warn_once
from agentkv.events._context import (
    ModelCall,
    Trajectory,
    begin_model_call,
    current_trajectory,
    make_current,
    restore_current,
)
from agentkv.events._decorators import ToolCallScope
from agentkv.integrations._agents_model import (
    GROUPS,
    PROCESSORS,
    AgentKVModelProvider,
    conversation,
    end_conversation,
    tracing_is_disabled,
)
from agentkv.integrations._common import ToolClasses, active, tool_class_of

try:
    from agents import RunHooks
    from agents.tracing import TracingProcessor
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "agentkv.integrations.openai_agents needs the OpenAI Agents SDK: "
        "pip install 'agentkv-cache[openai-agents]'"
    ) from exc

__all__ = [
    "AgentKVModelProvider",
    "AgentKVRunHooks",
    "AgentKVTracingProcessor",
    "conversation",
    "end_conversation",
]

_MAX_ID = 256


class _Open:
    """What a trace or span opened: a trajectory made current, a tool scope or a turn."""

    __slots__ = ("conversation", "model", "owned", "token", "tool", "traj")

    def __init__(self, traj: Trajectory | None) -> None:
        self.traj = traj
        self.owned = False
        self.conversation = False
        self.token: contextvars.Token[Trajectory | None] | None = None
        self.tool: ToolCallScope | None = None
        self.model: ModelCall | None = None


def _start_tool(traj: Trajectory | None, tool_classes: ToolClasses, name: str) -> ToolCallScope:
    name = (name or "tool")[:256]
    scope = ToolCallScope(tool_class_of(tool_classes, name), name)
    with active(traj):
        scope.__enter__()
    return scope


def _exc_now() -> BaseException | None:
    exc = sys.exc_info()[1]
    return exc if isinstance(exc, BaseException) else None


class AgentKVTracingProcessor(TracingProcessor):
    """Agents SDK tracing processor: traces are trajectories, tool spans tool events.

    Args:
        tool_classes: tool name -> tool class (a mapping or a function).
        tenant: tenant of the trajectories (a trace's ``metadata["agentkv_tenant"]``
            wins).
        tool_events: emit tool events for function-tool spans.
        model_events: advance the turn on generation / response spans (for a model
            whose OpenAI client is not wrapped with :func:`agentkv.wrap_openai`).

    The SDK calls processors synchronously; every method here is cheap, thread-safe
    and never raises into the SDK.
    """

    def __init__(
        self,
        *,
        tool_classes: ToolClasses = None,
        tenant: str | None = None,
        tool_events: bool = True,
        model_events: bool = False,
    ) -> None:
        self.tool_classes = tool_classes
        self.tenant = tenant
        self.tool_events = tool_events
        self.model_events = model_events
        self._live = GROUPS
        self._open: dict[str, _Open] = {}  # trace id or span id -> what it opened
        self._lock = threading.Lock()
        PROCESSORS.add(self)
        if tracing_is_disabled():
            warn_once(
                "agents-tracing-off",
                "agentkv: AgentKVTracingProcessor is set up but the Agents SDK's tracing is "
                "disabled, so it will see no run, tool or model event. Use "
                "RunConfig(model_provider=AgentKVModelProvider()) with "
                "agentkv.integrations.openai_agents.conversation(group_id) instead.",
            )

    # --- traces ------------------------------------------------------------------------
    def on_trace_start(self, trace: Any) -> None:
        """Open the run's trajectory (id: ``group_id`` or ``trace_id``) and make it current."""
        try:
            cur = current_trajectory()
            if cur is not None:
                item = _Open(cur)  # the user's (or an enclosing run's) trajectory
            else:
                metadata = getattr(trace, "metadata", None) or {}
                tenant = metadata.get("agentkv_tenant", self.tenant)
                group = getattr(trace, "group_id", None)
                tid = str(group or trace.trace_id)[:_MAX_ID]
                traj = self._live.open(
                    tid,
                    tenant=tenant if isinstance(tenant, str) else None,
                    metadata={"framework": "openai-agents", "workflow": str(trace.name)[:128]},
                )
                item = _Open(traj)
                item.owned = True
                item.conversation = bool(group)
                item.token = make_current(traj)
            with self._lock:
                self._open[trace.trace_id] = item
        except Exception as exc:
            internal_error("agents on_trace_start", exc)

    def on_trace_end(self, trace: Any) -> None:
        """End the run's trajectory and restore the previous current trajectory."""
        try:
            with self._lock:
                item = self._open.pop(trace.trace_id, None)
            if item is None or not item.owned or item.traj is None:
                return
            self._close_owned(item, _exc_now())
        except Exception as exc:
            internal_error("agents on_trace_end", exc)

    def _close_owned(self, item: _Open, exc: BaseException | None) -> None:
        if item.token is not None:
            with suppress(ValueError):  # ended in another context
                restore_current(item.token)
        if item.traj is None:
            return
        if item.conversation and exc is None:  # a group_id: the conversation goes on
            self._live.pause(item.traj)
        else:
            self._live.finish(item.traj, exc)

    # --- spans -------------------------------------------------------------------------
    def on_span_start(self, span: Any) -> None:
        """Tool spans start tool events; agents run from a tool open child trajectories."""
        try:
            kind = getattr(span.span_data, "type", None)
            item: _Open | None = None
            if kind == "function" and self.tool_events:
                traj = current_trajectory()
                if traj is not None:
                    item = _Open(traj)
                    item.tool = _start_tool(traj, self.tool_classes, str(span.span_data.name))
            elif kind in ("generation", "response") and self.model_events:
                traj = current_trajectory()
                if traj is not None:
                    item = _Open(traj)
                    item.model = begin_model_call(traj)
            elif kind in ("task", "agent"):  # a nested run starts with a task span
                item = self._maybe_child(span)
            if item is not None:
                with self._lock:
                    self._open[span.span_id] = item
        except Exception as exc:
            internal_error("agents on_span_start", exc)

    def _maybe_child(self, span: Any) -> _Open | None:
        with self._lock:
            parent = self._open.get(span.parent_id) if span.parent_id else None
        if parent is None or parent.tool is None or parent.traj is None:
            return None  # not inside a tool call: the same trajectory goes on
        name = str(parent.tool.name if parent.tool is not None else "agent")[:64]
        tid = f"{parent.traj.trajectory_id}/{name}-{str(span.span_id)[-8:]}"[:_MAX_ID]
        traj = self._live.open(
            tid,
            parent=parent.traj,
            metadata={"framework": "openai-agents", "via_tool": name},
        )
        item = _Open(traj)
        item.owned = True
        item.token = make_current(traj)
        return item

    def on_span_end(self, span: Any) -> None:
        """Finish what the span started (tool event, turn, child trajectory)."""
        try:
            with self._lock:
                item = self._open.pop(span.span_id, None)
            if item is None:
                return
            error = getattr(span, "error", None)
            if item.tool is not None:
                item.tool.__exit__(RuntimeError if error else None, None, None)
            elif item.model is not None:
                item.model.end("error" if error else "ok")
            elif item.owned:
                self._close_owned(
                    item, _exc_now() or (RuntimeError("agent error") if error else None)
                )
        except Exception as exc:
            internal_error("agents on_span_end", exc)

    def shutdown(self) -> None:
        """Nothing to flush: events went out as they happened."""

    def force_flush(self) -> None:
        """Nothing to flush: events went out as they happened."""


class AgentKVRunHooks(RunHooks[Any]):
    """``Runner.run(..., hooks=AgentKVRunHooks())``: tool events (and optionally turns).

    Events go to the trajectory current where ``Runner.run`` was called (open one with
    ``agentkv.trajectory(...)``); outside any trajectory the hooks do nothing. Do not
    combine with :class:`AgentKVTracingProcessor`'s ``tool_events`` (events would double).
    """

    def __init__(self, *, tool_classes: ToolClasses = None, model_events: bool = False) -> None:
        self.tool_classes = tool_classes
        self.model_events = model_events
        self._open: dict[Any, _Open] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _tool_key(context: Any, tool: Any) -> Any:
        call_id = getattr(context, "tool_call_id", None)
        return ("tool", call_id) if call_id else ("tool", id(context), getattr(tool, "name", ""))

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        """Emit ``tool_started`` with the tool's class."""
        try:
            traj = current_trajectory()
            if traj is None:
                return
            item = _Open(traj)
            item.tool = _start_tool(traj, self.tool_classes, str(getattr(tool, "name", "tool")))
            with self._lock:
                self._open[self._tool_key(context, tool)] = item
        except Exception as exc:
            internal_error("agents on_tool_start", exc)

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        """Emit ``tool_finished``."""
        try:
            with self._lock:
                item = self._open.pop(self._tool_key(context, tool), None)
            if item is not None and item.tool is not None:
                item.tool.__exit__(None, None, None)
        except Exception as exc:
            internal_error("agents on_tool_end", exc)

    async def on_llm_start(
        self, context: Any, agent: Any, system_prompt: Any, input_items: Any
    ) -> None:
        """With ``model_events``: advance the turn (``model_started``)."""
        if not self.model_events:
            return
        try:
            traj = current_trajectory()
            if traj is None:
                return
            item = _Open(traj)
            item.model = begin_model_call(traj)
            with self._lock:
                self._open[("llm", id(context), id(agent))] = item
        except Exception as exc:
            internal_error("agents on_llm_start", exc)

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        """With ``model_events``: mark the answer complete."""
        if not self.model_events:
            return
        try:
            with self._lock:
                item = self._open.pop(("llm", id(context), id(agent)), None)
            if item is not None and item.model is not None:
                item.model.end()
        except Exception as exc:
            internal_error("agents on_llm_end", exc)
