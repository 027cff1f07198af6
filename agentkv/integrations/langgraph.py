"""LangGraph / LangChain v1 integration: a callback handler for any graph, a middleware
for ``create_agent``.

Any graph, one line (the stock ``ToolNode`` included; see
:class:`AgentKVCallbackHandler`)::

    handler = AgentKVCallbackHandler(tool_classes={"grep": "search"})
    wrap_chat_openai(llm)  # hints on the model's requests
    graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}, "callbacks": [handler]})

``create_agent`` (the middleware also wraps ``ChatOpenAI`` clients itself)::

    from langchain.agents import create_agent
    from agentkv.integrations.langgraph import AgentKVMiddleware

    agent = create_agent(llm, tools, middleware=[AgentKVMiddleware(tool_classes={"grep": "search"})])
    agent.invoke({"messages": [...]}, {"configurable": {"thread_id": "t-1"}})

A ``thread_id`` is a conversation: *one* trajectory across invokes (turns continue; the
time between runs is the idle pseudo-tool ``human``; nothing is released between runs).
It ends with :func:`end_thread`, when a checkpointer given to :func:`watch_checkpointer`
deletes the thread, or after an idle TTL (see :mod:`agentkv.integrations._lg_common`).

What the middleware maps (the same in sync and async graphs):

- the graph's ``thread_id`` is the trajectory id (a run without one gets ``lg-<uuid>``);
  the run starts (or resumes the thread's conversation) in ``before_agent`` and pauses
  in ``after_agent`` (a run without a thread ends: ``trajectory_finished``); an
  exception leaving a model or tool call ends it with status ``error`` (cancellation:
  ``trajectory_cancelled``); an interrupt leaves it open;
- each tool call is a tool event pair with its tool class (``tool_classes`` maps tool
  names to classes; a tool already decorated with ``@agentkv.tool`` keeps its own
  events); parallel tool calls each get their own pair;
- an agent invoked from inside one of these tool calls (a subagent), or used as a
  subgraph node, is a child trajectory of the caller;
- a ``ChatOpenAI`` model's OpenAI clients are wrapped once with :func:`agentkv.wrap_openai`,
  so its requests carry the hints. ChatOpenAI passes its own ``extra_body`` (instance or
  per call) to the client, and the client *merges* the hint fields under it — keys of
  ``vllm_xargs`` included — so neither replaces the other. Other chat models get turn
  events only.

The middleware makes the trajectory current only around each model and tool call, so
``agentkv.current_trajectory()``, ``@agentkv.tool`` functions and wrapped clients called
from inside those calls see it. For a hand-built graph, use :func:`tool_node`,
:func:`wrap_chat_openai` and :func:`graph_trajectory`.

Put ``AgentKVMiddleware`` first in ``middleware=[...]`` (outermost), so that a retry
middleware's retries stay inside one trajectory.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from types import TracebackType
from typing import Annotated, Any, NotRequired

from agentkv._guard import internal_error
from agentkv.client._wrap import wrap_openai
from agentkv.events._context import (
    INHERIT,
    Trajectory,
    TrajectoryScope,
    current_trajectory,
    model_call,
)
from agentkv.events._decorators import tool_call
from agentkv.integrations._common import ToolClasses, active, tool_class_of
from agentkv.integrations._lg_callbacks import AgentKVCallbackHandler
from agentkv.integrations._lg_common import (
    CONVERSATIONS,
    end_thread,
    fit_id,
    short_hash,
    trajectory_id_for,
    watch_checkpointer,
)

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState
    from langchain.agents.middleware.types import PrivateStateAttr
    from langgraph.config import get_config
    from langgraph.errors import GraphBubbleUp
    from langgraph.prebuilt import ToolNode
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "agentkv.integrations.langgraph needs LangGraph and LangChain v1: "
        "pip install 'agentkv[langgraph]'"
    ) from exc

__all__ = [
    "STATE_KEY",
    "AgentKVCallbackHandler",
    "AgentKVMiddleware",
    "AgentKVState",
    "end_thread",
    "graph_trajectory",
    "tool_node",
    "trajectory_id_for",
    "watch_checkpointer",
    "wrap_chat_openai",
]

#: The private agent-state key holding the run's trajectory id.
STATE_KEY = "agentkv_trajectory_id"

_LIVE = CONVERSATIONS
_fit = fit_id
_h8 = short_hash

ToolWrapper = Callable[[Any, Callable[[Any], Any]], Any]
AsyncToolWrapper = Callable[[Any, Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


class AgentKVState(AgentState[Any]):
    """Agent state with agentkv's private trajectory id (hidden from input and output)."""

    agentkv_trajectory_id: NotRequired[Annotated[str | None, PrivateStateAttr]]


def graph_trajectory(
    config: Mapping[str, Any] | None = None,
    *,
    tenant: str | None = None,
    parent: Trajectory | str | None = INHERIT,
) -> TrajectoryScope:
    """A trajectory scope for one run of a hand-built graph, named by its ``thread_id``.

    ::

        config = {"configurable": {"thread_id": "t-1"}}
        with graph_trajectory(config):
            graph.invoke(inputs, config)

    LangGraph copies the caller's context into every node, so tool nodes built with
    :func:`tool_node` and models wrapped with :func:`wrap_chat_openai` see it.
    """
    from agentkv.events._context import trajectory

    return trajectory(trajectory_id_for(config), tenant=tenant, parent=parent)


def wrap_chat_openai(llm: Any, **options: Any) -> Any:
    """Wrap a ``ChatOpenAI``'s OpenAI clients (sync and async) with :func:`agentkv.wrap_openai`.

    Changes ``llm``'s clients in place and returns ``llm``; ``options`` go to
    ``wrap_openai`` (``backend``, ``mode``, ...). Calls made inside a trajectory then
    carry the hints, merged under the model's own ``extra_body``. A model without
    OpenAI clients is returned unchanged.
    """
    for attr in ("root_client", "root_async_client"):
        client = getattr(llm, attr, None)
        if client is not None and hasattr(client, "chat"):
            wrap_openai(client, **options)
    return llm


def _is_wrapped(llm: Any) -> bool:
    for attr in ("root_client", "root_async_client"):
        client = getattr(llm, attr, None)
        if client is not None and vars(client).get("_agentkv_state") is not None:
            return True
    return False


def _state_get(state: Any, key: str) -> Any:
    if isinstance(state, Mapping):
        return state.get(key)
    return getattr(state, key, None)


def _current_config() -> Mapping[str, Any]:
    try:
        return get_config()
    except RuntimeError:  # called outside a runnable context
        return {}


def _is_decorated_tool(tool: Any) -> bool:
    for attr in ("func", "coroutine"):
        if getattr(getattr(tool, attr, None), "__agentkv_tool__", None) is not None:
            return True
    return False


class _CallScope:
    """Around one model or tool call: current trajectory, its events, errors end the run."""

    __slots__ = ("_stack", "_traj")

    def __init__(self, traj: Trajectory | None, inner: AbstractContextManager[Any]) -> None:
        self._traj = traj
        self._stack = ExitStack()
        self._stack.enter_context(active(traj))
        try:
            self._stack.enter_context(inner)
        except Exception as exc:
            internal_error("langgraph call scope", exc)

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stack.__exit__(exc_type, exc, tb)
        traj = self._traj
        if exc is None or traj is None or isinstance(exc, GraphBubbleUp):
            return
        if traj in _LIVE:  # only trajectories the middleware opened
            _LIVE.finish(traj, exc)


class AgentKVMiddleware(AgentMiddleware[AgentKVState, Any, Any]):
    """LangChain v1 agent middleware: trajectories, tool events and request hints.

    Args:
        tool_classes: tool name -> tool class (a mapping or a function); unmapped
            names are their own class.
        tenant: tenant of the trajectories (isolates cache state between tenants).
        wrap_models: wrap ``ChatOpenAI`` clients with :func:`agentkv.wrap_openai`
            on first use (set False if you wrap them yourself).
        wrap_options: passed to ``wrap_openai`` (``backend="vllm"``, ``mode="shadow"``, ...).
    """

    state_schema = AgentKVState

    def __init__(
        self,
        *,
        tool_classes: ToolClasses = None,
        tenant: str | None = None,
        wrap_models: bool = True,
        **wrap_options: Any,
    ) -> None:
        super().__init__()
        self.tool_classes = tool_classes
        self.tenant = tenant
        self.wrap_models = wrap_models
        self.wrap_options = wrap_options

    # --- the run ---------------------------------------------------------------------
    def _begin(self, config: Mapping[str, Any]) -> str | None:
        try:
            configurable = config.get("configurable") or {}
            metadata = config.get("metadata") or {}
            cur = current_trajectory()
            if cur is not None and cur not in _LIVE:
                _LIVE.borrow(cur)  # the user opened a trajectory around the run
                return cur.trajectory_id
            name = str(metadata.get("lc_agent_name") or "agent")[:64]
            ns = str(configurable.get("checkpoint_ns") or "")
            parent_ns = ns.rsplit("|", 1)[0] if "|" in ns else ""
            thread_id = trajectory_id_for(config)
            parent: Trajectory | str | None = None
            if cur is not None:  # called from one of our model or tool calls: a subagent
                parent = cur
                tid = f"{cur.trajectory_id}/{name}-{_h8(parent_ns or uuid.uuid4().hex)}"
            elif parent_ns:  # a subgraph node
                parent = _LIVE.get(thread_id, self.tenant) or thread_id
                tid = f"{thread_id or 'lg'}/{name}-{_h8(parent_ns)}"
            else:
                tid = thread_id or f"lg-{uuid.uuid4().hex}"
            meta = {"agent_name": name, "framework": "langgraph"}
            traj = _LIVE.open(_fit(tid), tenant=self.tenant, parent=parent, metadata=meta)
            return traj.trajectory_id
        except Exception as exc:
            internal_error("langgraph before_agent", exc)
            return None

    def _trajectory(self, state: Any) -> Trajectory | None:
        tid = _state_get(state, STATE_KEY)
        traj = _LIVE.get(tid, self.tenant)
        if traj is not None:
            return traj
        if isinstance(tid, str) and tid:  # e.g. resumed from a checkpoint in a new process
            return _LIVE.open(tid, tenant=self.tenant)
        return current_trajectory()

    def before_agent(self, state: AgentKVState, runtime: Any) -> dict[str, Any] | None:
        """Open the run's trajectory (id from ``thread_id``) and keep its id in the state."""
        return {STATE_KEY: self._begin(_current_config())}

    async def abefore_agent(self, state: AgentKVState, runtime: Any) -> dict[str, Any] | None:
        """Async twin of :meth:`before_agent`."""
        return {STATE_KEY: self._begin(_current_config())}

    def after_agent(self, state: AgentKVState, runtime: Any) -> dict[str, Any] | None:
        """End the run: a thread's conversation pauses (the next invoke continues it);
        a run without a thread, or a subagent, ends (``trajectory_finished``)."""
        try:
            tid = _state_get(state, STATE_KEY)
            traj = _LIVE.get(tid, self.tenant)
            conversation = (
                traj is not None
                and traj.parent_id is None
                and tid == trajectory_id_for(_current_config())
            )
            if conversation:
                _LIVE.pause(traj)
            else:
                _LIVE.finish(traj if traj is not None else tid, tenant=self.tenant)
        except Exception as exc:
            internal_error("langgraph after_agent", exc)
        return None

    async def aafter_agent(self, state: AgentKVState, runtime: Any) -> dict[str, Any] | None:
        """Async twin of :meth:`after_agent`."""
        return self.after_agent(state, runtime)

    # --- model calls -------------------------------------------------------------------
    def _model_scope(self, request: Any) -> _CallScope:
        traj = self._trajectory(request.state)
        llm = request.model
        inner: AbstractContextManager[Any] = nullcontext()
        try:
            if self.wrap_models:
                wrap_chat_openai(llm, **self.wrap_options)
            if not _is_wrapped(llm):  # no client wrapper to advance the turn: do it here
                inner = model_call(getattr(llm, "model_name", None))
        except Exception as exc:
            internal_error("langgraph model instrumentation", exc)
        return _CallScope(traj, inner)

    def wrap_model_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Run the model call inside the trajectory (hints via the wrapped client)."""
        with self._model_scope(request):
            return handler(request)

    async def awrap_model_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """Async twin of :meth:`wrap_model_call`."""
        with self._model_scope(request):
            return await handler(request)

    # --- tool calls --------------------------------------------------------------------
    def _tool_scope(self, request: Any) -> _CallScope:
        return _tool_scope(request, self._trajectory(request.state), self.tool_classes)

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        """Run the tool call as a tool event pair with its class."""
        with self._tool_scope(request):
            return handler(request)

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        """Async twin of :meth:`wrap_tool_call`."""
        with self._tool_scope(request):
            return await handler(request)


def _tool_scope(request: Any, traj: Trajectory | None, tool_classes: ToolClasses) -> _CallScope:
    inner: AbstractContextManager[Any] = nullcontext()
    if traj is not None:
        try:
            if not _is_decorated_tool(getattr(request, "tool", None)):
                name = str(request.tool_call.get("name") or "tool")[:256]
                inner = tool_call(tool_class_of(tool_classes, name), name=name)
        except Exception as exc:
            internal_error("langgraph tool instrumentation", exc)
    return _CallScope(traj, inner)


def _node_trajectory(request: Any) -> Trajectory | None:
    traj = _LIVE.get(_state_get(getattr(request, "state", None), STATE_KEY))
    return traj if traj is not None else current_trajectory()


def make_tool_wrappers(
    tool_classes: ToolClasses = None,
) -> tuple[ToolWrapper, AsyncToolWrapper]:
    """The ``(wrap_tool_call, awrap_tool_call)`` pair :func:`tool_node` installs."""

    def wrap(request: Any, execute: Callable[[Any], Any]) -> Any:
        with _tool_scope(request, _node_trajectory(request), tool_classes):
            return execute(request)

    async def awrap(request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
        with _tool_scope(request, _node_trajectory(request), tool_classes):
            return await execute(request)

    return wrap, awrap


def tool_node(
    tools: Sequence[Any],
    *,
    tool_classes: ToolClasses = None,
    wrap_tool_call: ToolWrapper | None = None,
    awrap_tool_call: AsyncToolWrapper | None = None,
    **kwargs: Any,
) -> ToolNode:
    """A ``ToolNode`` whose tool calls are agentkv tool events (sync and async, parallel).

    The events go to the current trajectory (open one with :func:`graph_trajectory`
    around ``graph.invoke``); outside any trajectory the tools run uninstrumented. Your
    own ``wrap_tool_call`` / ``awrap_tool_call`` run inside agentkv's, so retries stay
    within one tool event pair. ``kwargs`` go to ``ToolNode``.
    """
    ours, aours = make_tool_wrappers(tool_classes)
    sync_wrap: ToolWrapper = ours
    async_wrap: AsyncToolWrapper = aours
    if wrap_tool_call is not None:
        user = wrap_tool_call

        def sync_wrap(request: Any, execute: Callable[[Any], Any]) -> Any:
            return ours(request, lambda r: user(r, execute))

    if awrap_tool_call is not None:
        auser = awrap_tool_call

        async def async_wrap(request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
            return await aours(request, lambda r: auser(r, execute))

    return ToolNode(tools, wrap_tool_call=sync_wrap, awrap_tool_call=async_wrap, **kwargs)
