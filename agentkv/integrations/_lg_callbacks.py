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
  that fails finishes its trajectory with status ``error`` (an interrupt pauses it).
  The thread comes from the run's ``metadata`` (where LangGraph copies a truthy
  ``thread_id``) or else from ``config["configurable"]["thread_id"]``, read from
  LangChain's runnable config once the run's first model or tool call starts (a plain
  LangChain runnable, or a thread id LangGraph does not copy, such as ``0``);
- each tool run is a tool event pair with its class and LangChain's tool call id;
- a graph or chain run inside a tool run (a subagent) is a child trajectory of the
  caller, ``<parent>/<name>-<hash8>`` as with the middleware, with its parent recorded;
  it ends with its run (an interrupt pauses it, so a resumed subagent continues). Its
  own model and tool calls are its turns and tool events, not the caller's;
- model calls made with a client wrapped by :func:`agentkv.wrap_openai` (for a
  ``ChatOpenAI``: ``wrap_chat_openai(llm)``) find the trajectory from LangChain's
  runnable config and carry the hints; ``model_events=True`` advances the turn from the
  callbacks instead, for a model whose client is not wrapped.

Trajectories open lazily, at the first model or tool call inside their run (a thread
named in ``metadata``: at once, so a resumed conversation's idle gap ends at the run's
start), so a chain used as a tool that calls no model leaves no child trajectory.

Durable threads: a thread the handler opens that is not live in this process (a new
process resumed it from the graph's checkpointer, or resumed an interrupt) continues its
turn count from the thread's last checkpoint, so its next model call is a resumed turn,
not turn 0. The count is the state's ``agentkv_turns`` where the ``create_agent``
middleware keeps it, else the number of AI messages in the state's ``messages`` (one per
model call). The checkpointer is the handler's ``checkpointer`` argument, else the one
LangGraph puts in the run's config (read at the run's first model or tool call). A state
without either (no ``messages`` channel, messages trimmed away) continues from what it
shows: the count only moves forward. A thread id live here under another tenant is a
new conversation of this tenant (turn 0), not a restart.

Callbacks run inline in the caller's thread or task (``run_inline``): each is a few
dictionary operations and never raises into LangChain (``raise_error`` is off).
"""

from __future__ import annotations

import sys
import threading
import uuid
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler

from agentkv._guard import internal_error
from agentkv.events._context import (
    ModelCall,
    Trajectory,
    begin_model_call,
    continue_turns,
    current_trajectory,
)
from agentkv.events._decorators import ToolCallScope
from agentkv.integrations._common import ToolClasses, active, tool_class_of
from agentkv.integrations._lg_common import (
    CONVERSATIONS,
    child_trajectory_id,
    end_thread,
    fit_id,
    is_interrupt,
    state_get,
    trajectory_id_for,
)

__all__ = ["AgentKVCallbackHandler"]

#: The run name LangGraph gives a compiled graph that was not named.
_DEFAULT_GRAPH_NAME = "LangGraph"
#: Where LangGraph puts a run's checkpointer in its config (``CONFIG_KEY_CHECKPOINTER``).
_CONFIG_CHECKPOINTER = "__pregel_checkpointer"
#: The middleware's state key for the model-call count (``_lg_middleware.TURNS_KEY``).
_TURNS_KEY = "agentkv_turns"


class _Run:
    """A trajectory the handler tracks: a root run's, or a subagent's (a run inside a tool).

    ``traj`` is None until the first model or tool call inside the run needs it (then
    :meth:`AgentKVCallbackHandler._trajectory` opens it); ``owned`` is False for a
    trajectory the user opened around the run (never ended here).
    """

    __slots__ = (
        "conversation",
        "key",
        "metadata",
        "name",
        "owned",
        "parent",
        "restore",
        "run_id",
        "thread",
        "traj",
    )

    def __init__(
        self,
        run_id: UUID,
        *,
        traj: Trajectory | None = None,
        owned: bool = True,
        parent: _Run | None = None,
        name: str = "agent",
        key: str = "",
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.run_id = run_id
        self.traj = traj
        self.owned = owned
        self.conversation = False
        self.parent = parent  # the caller's run, for a subagent
        self.name = name
        self.key = key  # tells the caller's children apart (namespace, tool call id)
        self.metadata = metadata or {}
        #: The thread's own id (as the checkpointer keys it), for a conversation run.
        self.thread: Any = None
        #: The conversation was opened fresh here: its turn count is still to be read
        #: from the thread's last checkpoint.
        self.restore = False


def _thread_of(value: Any) -> str | None:
    if value is None or value == "":
        return None
    return fit_id(str(value))


def _checkpointed_turns(values: Any) -> int | None:
    """The model calls a thread made, read from its checkpointed channel values: the
    middleware's ``agentkv_turns``, else the AI messages in ``messages``."""
    turns = state_get(values, _TURNS_KEY)
    if isinstance(turns, int) and not isinstance(turns, bool):
        return turns
    messages = state_get(values, "messages")
    if not isinstance(messages, list):
        return None
    return sum(1 for m in messages if getattr(m, "type", None) == "ai")


def _current_config() -> Any:
    module = sys.modules.get("langchain_core.runnables.config")
    return module.var_child_runnable_config.get() if module is not None else None


def _run_name(metadata: dict[str, Any], name: Any) -> str:
    """A subagent's name: the graph's own name, else its agent name, else ``agent``."""
    if isinstance(name, str) and name and name != _DEFAULT_GRAPH_NAME:
        return name[:64]
    agent = metadata.get("lc_agent_name") or metadata.get("agent_name")
    return str(agent)[:64] if agent else "agent"


class AgentKVCallbackHandler(BaseCallbackHandler):
    """LangChain callback handler: conversations, run boundaries, tool events, subagents.

    Args:
        tool_classes: tool name -> tool class (a mapping or a function).
        tenant: tenant of the trajectories (isolates cache state between tenants).
        model_events: advance the turn on chat-model callbacks (for a model whose
            OpenAI client is not wrapped; a wrapped client advances it itself).
        idle_ttl_s: a conversation idle this long ends (its KV is released) when the
            next run of any thread starts.
        checkpointer: the graph's checkpointer (a LangGraph ``BaseCheckpointSaver``),
            read when a thread not live in this process starts, so its turn count
            continues from the last checkpoint. Without it, the checkpointer LangGraph
            passes in the run's config is read at the run's first model or tool call.
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
        checkpointer: Any = None,
    ) -> None:
        super().__init__()
        self.tool_classes = tool_classes
        self.checkpointer = checkpointer
        self.tenant = tenant
        self.model_events = model_events
        if idle_ttl_s is not None:
            CONVERSATIONS.idle_ttl_s = idle_ttl_s
        self._lock = threading.Lock()
        self._opening = threading.RLock()  # opening a lazy trajectory (a child opens its parent)
        self._runs: dict[UUID, _Run] = {}  # root and subagent runs by their own run id
        self._owner: dict[UUID, _Run] = {}  # every live run -> the trajectory run it is in
        self._tools: dict[UUID, ToolCallScope] = {}
        self._models: dict[UUID, ModelCall] = {}

    # --- lookups (also used by the client through LangChain's runnable config) --------
    def agentkv_trajectory_of(self, run_id: UUID | None) -> Trajectory | None:
        """The trajectory of a run this handler has seen (None: unknown run)."""
        run = self._owner.get(run_id) if run_id is not None else None
        return self._trajectory(run) if run is not None else None

    @staticmethod
    def end_thread(thread_id: str) -> bool:
        """End a thread's conversation now (``trajectory_finished``; KV released)."""
        return end_thread(thread_id)

    def _trajectory(self, run: _Run) -> Trajectory | None:
        """``run``'s trajectory, opened on first use (a fresh conversation's turn count
        restored from its checkpoint then)."""
        if run.traj is not None and not run.restore:
            return run.traj
        with self._opening:
            if run.traj is None:
                run.traj = self._open(run)
            if run.restore:
                run.restore = False
                self._restore(run, _current_config())
        return run.traj

    def _open_thread(self, run: _Run, thread: Any, meta: dict[str, Any]) -> Trajectory:
        """Open (or resume the live) conversation of ``thread`` for the root ``run``."""
        tid = fit_id(str(thread))
        run.conversation = True
        run.thread = thread
        # Not live in this process under any tenant (another tenant on the same thread id
        # is a conversation of its own, not a restart): read the count from the checkpoint.
        run.restore = not CONVERSATIONS.holds(tid)
        return CONVERSATIONS.open(tid, tenant=self.tenant, metadata=meta)

    def _restore(self, run: _Run, config: Any) -> None:
        """Continue a fresh conversation's turns from its thread's last checkpoint."""
        traj = run.traj
        if traj is None:
            return
        saver = self.checkpointer
        if saver is None:
            configurable = (config or {}).get("configurable") or {}
            if trajectory_id_for(config) != traj.trajectory_id:
                return  # another graph's config (or none): not this thread's checkpointer
            saver = configurable.get(_CONFIG_CHECKPOINTER)
        get_tuple = getattr(saver, "get_tuple", None)
        if get_tuple is None:
            return
        try:
            saved = get_tuple({"configurable": {"thread_id": run.thread, "checkpoint_ns": ""}})
        except Exception as exc:  # e.g. an async-only saver called from its event loop
            internal_error("langchain checkpoint read", exc)
            return
        checkpoint = getattr(saved, "checkpoint", None)
        if isinstance(checkpoint, dict):
            continue_turns(traj, _checkpointed_turns(checkpoint.get("channel_values")))

    def _open(self, run: _Run) -> Trajectory | None:  # under self._opening
        if run.parent is not None:  # a subagent: a child of the caller's trajectory
            parent = self._trajectory(run.parent)
            if parent is None:
                return None
            tid = child_trajectory_id(parent.trajectory_id, run.name, run.key)
            return CONVERSATIONS.open(tid, tenant=self.tenant, parent=parent, metadata=run.metadata)
        config = _current_config()
        thread = self._configured_thread(config)
        if thread is None:
            return CONVERSATIONS.open(
                f"lg-{uuid.uuid4().hex}", tenant=self.tenant, metadata=run.metadata
            )
        return self._open_thread(run, thread, run.metadata)

    def _configured_thread(self, config: Any) -> Any:
        """``configurable.thread_id`` (else ``metadata.thread_id``) of ``config``, the
        runnable config of the current context, where that config is one this handler is
        called for (LangChain sets it around each runnable's body, so inside a run's model
        or tool call it is the run's own); None when it names no thread."""
        if not config:
            return None
        callbacks = config.get("callbacks")
        handlers = getattr(callbacks, "handlers", callbacks)
        if not isinstance(handlers, list) or not any(h is self for h in handlers):
            return None
        if trajectory_id_for(config) is None:
            return None
        thread = (config.get("configurable") or {}).get("thread_id")
        return thread if thread is not None else (config.get("metadata") or {}).get("thread_id")

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
        """A root run opens or resumes its conversation; a run in a tool is a subagent.

        Other inner runs join the trajectory of the run they are in."""
        try:
            if parent_run_id is None:
                self._start_root(run_id, metadata or {})
                return
            owner = self._owner.get(parent_run_id)
            if owner is None:
                return
            if parent_run_id in self._tools:
                owner = self._start_child(run_id, owner, parent_run_id, metadata or {}, kwargs)
            with self._lock:
                self._owner[run_id] = owner
        except Exception as exc:
            internal_error("langchain on_chain_start", exc)

    def _start_root(self, run_id: UUID, metadata: dict[str, Any]) -> None:
        cur = current_trajectory()
        if cur is not None:  # the user opened a trajectory around the run: use it
            run = _Run(run_id, traj=cur, owned=False)
        else:
            name = str(metadata.get("lc_agent_name") or metadata.get("agent_name") or "agent")
            meta = {"agent_name": name[:64], "framework": "langgraph"}
            run = _Run(run_id, metadata=meta)
            thread = metadata.get("thread_id")
            if _thread_of(thread) is not None:  # named by LangGraph's metadata: resume it now
                run.traj = self._open_thread(run, thread, meta)
                if run.restore and self.checkpointer is not None:
                    run.restore = False
                    self._restore(run, None)
        with self._lock:
            self._runs[run_id] = run
            self._owner[run_id] = run

    def _start_child(
        self,
        run_id: UUID,
        caller: _Run,
        tool_run_id: UUID,
        metadata: dict[str, Any],
        kwargs: dict[str, Any],
    ) -> _Run:
        scope = self._tools.get(tool_run_id)
        call_id = scope.call_id if scope is not None else None
        parts = [str(metadata.get("checkpoint_ns") or ""), call_id or ""]
        key = "|".join(p for p in parts if p) or uuid.uuid4().hex
        name = _run_name(metadata, kwargs.get("name"))
        meta = {"agent_name": name, "framework": "langgraph"}
        run = _Run(run_id, parent=caller, name=name, key=key, metadata=meta)
        with self._lock:
            self._runs[run_id] = run
        return run

    def _end(self, run_id: UUID, error: BaseException | None) -> None:
        with self._lock:
            self._owner.pop(run_id, None)
            run = self._runs.pop(run_id, None)
        if run is None or not run.owned or run.traj is None:
            return
        if error is not None and not is_interrupt(error):
            CONVERSATIONS.finish(run.traj, error)
        elif run.conversation or (error is not None and run.parent is not None):
            CONVERSATIONS.pause(run.traj)  # the next run (or the resumed subagent) goes on
        else:
            CONVERSATIONS.finish(run.traj)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A root run's end pauses its conversation; a thread-less or subagent run ends."""
        try:
            self._end(run_id, None)
        except Exception as exc:
            internal_error("langchain on_chain_end", exc)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """A failed root or subagent run ends its trajectory with status ``error``."""
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
            owner = self._owner.get(parent_run_id) if parent_run_id is not None else None
            traj = self._trajectory(owner) if owner is not None else None
            if owner is None or traj is None:
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
                self._owner[run_id] = owner
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
            owner = self._owner.get(parent_run_id) if parent_run_id is not None else None
            if owner is None:
                return
            with self._lock:
                self._owner[run_id] = owner
            traj = self._trajectory(owner) if self.model_events else None
            if traj is not None:
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
