"""``AgentKVCallbackHandler``: LangGraph / LangChain in one line, with any graph.

::

    handler = AgentKVCallbackHandler(tool_classes={"grep": "search"})
    graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}, "callbacks": [handler]})

The handler sees run boundaries and tool calls through LangChain's callbacks, so it works
with the stock ``ToolNode``, ``create_agent`` and any hand-built graph:

- the root run of a graph opens (or resumes) the thread's conversation trajectory
  (:mod:`agentkv.integrations._lg_common`); its end pauses the conversation (the idle
  pseudo-tool ``human`` starts), so the next ``invoke`` on the thread continues it. A
  run without a ``thread_id`` is a trajectory of its own, finished at its end; a run
  that fails finishes its trajectory with status ``error`` (an interrupt pauses it);
- each tool run is a tool event pair with its class and LangChain's tool call id;
- model calls made with a client wrapped by :func:`agentkv.wrap_openai` (for a
  ``ChatOpenAI``: ``wrap_chat_openai(llm)``) find the trajectory from LangChain's
  runnable config and carry the hints; ``model_events=True`` advances the turn from the
  callbacks instead, for a model whose client is not wrapped.

Callbacks run inline in the caller's thread or task (``run_inline``): each is a few
dictionary operations and never raises into LangChain (``raise_error`` is off).
"""

from __future__ import annotations

import threading
import uuid
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from agentkv._guard import internal_error
from agentkv.events._context import ModelCall, Trajectory, begin_model_call, current_trajectory
from agentkv.events._decorators import ToolCallScope
from agentkv.integrations._common import ToolClasses, active, tool_class_of
from agentkv.integrations._lg_common import CONVERSATIONS, end_thread, fit_id, is_interrupt

__all__ = ["AgentKVCallbackHandler"]


class _Run:
    __slots__ = ("conversation", "owned", "traj")

    def __init__(self, traj: Trajectory, owned: bool, conversation: bool) -> None:
        self.traj = traj
        self.owned = owned
        self.conversation = conversation


class AgentKVCallbackHandler(BaseCallbackHandler):
    """LangChain callback handler: conversations, run boundaries and tool events.

    Args:
        tool_classes: tool name -> tool class (a mapping or a function).
        tenant: tenant of the trajectories (isolates cache state between tenants).
        model_events: advance the turn on chat-model callbacks (for a model whose
            OpenAI client is not wrapped; a wrapped client advances it itself).
        idle_ttl_s: a conversation idle this long ends (its KV is released) when the
            next run of any thread starts.
    """

    raise_error = False
    run_inline = True

    def __init__(
        self,
        *,
        tool_classes: ToolClasses = None,
        tenant: str | None = None,
        model_events: bool = False,
        idle_ttl_s: float | None = None,
    ) -> None:
        super().__init__()
        self.tool_classes = tool_classes
        self.tenant = tenant
        self.model_events = model_events
        if idle_ttl_s is not None:
            CONVERSATIONS.idle_ttl_s = idle_ttl_s
        self._lock = threading.Lock()
        self._roots: dict[UUID, _Run] = {}
        self._owner: dict[UUID, Trajectory] = {}  # every live run -> its trajectory
        self._tools: dict[UUID, ToolCallScope] = {}
        self._models: dict[UUID, ModelCall] = {}

    # --- lookups (also used by the client through LangChain's runnable config) --------
    def agentkv_trajectory_of(self, run_id: UUID | None) -> Trajectory | None:
        """The trajectory of a run this handler has seen (None: unknown run)."""
        return self._owner.get(run_id) if run_id is not None else None

    @staticmethod
    def end_thread(thread_id: str) -> bool:
        """End a thread's conversation now (``trajectory_finished``; KV released)."""
        return end_thread(thread_id)

    # --- runs --------------------------------------------------------------------------
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """A graph's root run opens or resumes its conversation; inner runs join it."""
        try:
            if parent_run_id is not None:
                parent = self._owner.get(parent_run_id)
                if parent is not None:
                    self._owner[run_id] = parent
                return
            self._start_root(run_id, metadata or {})
        except Exception as exc:
            internal_error("langchain on_chain_start", exc)

    def _start_root(self, run_id: UUID, metadata: dict[str, Any]) -> None:
        cur = current_trajectory()
        if cur is not None:  # the user opened a trajectory around the run: use it
            run = _Run(cur, owned=False, conversation=False)
        else:
            thread = metadata.get("thread_id")
            conversation = thread is not None and thread != ""
            tid = fit_id(str(thread)) if conversation else f"lg-{uuid.uuid4().hex}"
            name = str(metadata.get("lc_agent_name") or metadata.get("agent_name") or "agent")
            traj = CONVERSATIONS.open(
                tid,
                tenant=self.tenant,
                metadata={"agent_name": name[:64], "framework": "langgraph"},
            )
            run = _Run(traj, owned=True, conversation=conversation)
        with self._lock:
            self._roots[run_id] = run
            self._owner[run_id] = run.traj

    def _end(self, run_id: UUID, error: BaseException | None) -> None:
        with self._lock:
            self._owner.pop(run_id, None)
            run = self._roots.pop(run_id, None)
        if run is None or not run.owned:
            return
        if error is None or is_interrupt(error):
            if run.conversation:
                CONVERSATIONS.pause(run.traj)
            else:
                CONVERSATIONS.finish(run.traj)
        else:
            CONVERSATIONS.finish(run.traj, error)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """The root run's end pauses its conversation (or ends a thread-less run)."""
        try:
            self._end(run_id, None)
        except Exception as exc:
            internal_error("langchain on_chain_end", exc)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A failed root run ends its trajectory with status ``error``."""
        try:
            self._end(run_id, error)
        except Exception as exc:
            internal_error("langchain on_chain_error", exc)

    # --- tools -------------------------------------------------------------------------
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """``tool_started`` with the tool's class and call id."""
        try:
            traj = self._owner.get(parent_run_id) if parent_run_id is not None else None
            if traj is None:
                return
            name = str(kwargs.get("name") or (serialized or {}).get("name") or "tool")[:256]
            call_id = kwargs.get("tool_call_id")
            scope = ToolCallScope(
                tool_class_of(self.tool_classes, name),
                name,
                call_id if isinstance(call_id, str) else None,
            )
            with active(traj):
                scope.__enter__()
            with self._lock:
                self._tools[run_id] = scope
                self._owner[run_id] = traj
        except Exception as exc:
            internal_error("langchain on_tool_start", exc)

    def _tool_end(self, run_id: UUID, error: BaseException | None) -> None:
        with self._lock:
            scope = self._tools.pop(run_id, None)
            self._owner.pop(run_id, None)
        if scope is not None:
            scope.__exit__(type(error) if error is not None else None, error, None)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """``tool_finished`` (status ok)."""
        try:
            self._tool_end(run_id, None)
        except Exception as exc:
            internal_error("langchain on_tool_end", exc)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """``tool_finished`` (status error or cancelled)."""
        try:
            self._tool_end(run_id, error)
        except Exception as exc:
            internal_error("langchain on_tool_error", exc)

    # --- model turns (only with model_events) -----------------------------------------
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        """With ``model_events``: ``model_started`` (the turn advances)."""
        try:
            traj = self._owner.get(parent_run_id) if parent_run_id is not None else None
            if traj is None:
                return
            with self._lock:
                self._owner[run_id] = traj
            if self.model_events:
                call = begin_model_call(traj)
                with self._lock:
                    self._models[run_id] = call
        except Exception as exc:
            internal_error("langchain on_chat_model_start", exc)

    def _model_end(self, run_id: UUID, status: str) -> None:
        with self._lock:
            call = self._models.pop(run_id, None)
            self._owner.pop(run_id, None)
        if call is not None:
            call.end(status)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """The model's answer is complete."""
        try:
            self._model_end(run_id, "ok")
        except Exception as exc:
            internal_error("langchain on_llm_end", exc)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """The model call failed."""
        try:
            self._model_end(run_id, "error")
        except Exception as exc:
            internal_error("langchain on_llm_error", exc)
