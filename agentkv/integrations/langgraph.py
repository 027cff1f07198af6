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

The handler and the hand-built graph helpers need only ``langchain-core`` (and
``langgraph`` for :func:`tool_node`); ``AgentKVMiddleware`` and ``AgentKVState`` also need
``langchain`` and are imported on first use, with an ``ImportError`` naming what to
install where it is missing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agentkv.events._context import INHERIT, Trajectory, TrajectoryScope, current_trajectory
from agentkv.integrations._common import ToolClasses
from agentkv.integrations._lg_common import (
    CONVERSATIONS,
    STATE_KEY,
    end_thread,
    state_get,
    tool_scope,
    trajectory_id_for,
    watch_checkpointer,
    wrap_chat_openai,
)

try:
    from agentkv.integrations._lg_callbacks import AgentKVCallbackHandler
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "agentkv.integrations.langgraph needs langchain-core (and langgraph for graphs): "
        "pip install langgraph (or 'agentkv-cache[langgraph]')"
    ) from exc

if TYPE_CHECKING:
    from langgraph.prebuilt import ToolNode

    from agentkv.integrations._lg_middleware import AgentKVMiddleware, AgentKVState

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

#: The names that need the ``langchain`` package, imported on first access.
_MIDDLEWARE_NAMES = frozenset({"AgentKVMiddleware", "AgentKVState"})


def __getattr__(name: str) -> Any:
    if name in _MIDDLEWARE_NAMES:
        from agentkv.integrations import _lg_middleware

        value = getattr(_lg_middleware, name)
        globals()[name] = value  # later lookups skip this hook
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ToolWrapper = Callable[[Any, Callable[[Any], Any]], Any]
AsyncToolWrapper = Callable[[Any, Callable[[Any], Awaitable[Any]]], Awaitable[Any]]


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


def _node_trajectory(request: Any) -> Trajectory | None:
    traj = CONVERSATIONS.get(state_get(getattr(request, "state", None), STATE_KEY))
    return traj if traj is not None else current_trajectory()


def make_tool_wrappers(
    tool_classes: ToolClasses = None,
) -> tuple[ToolWrapper, AsyncToolWrapper]:
    """The ``(wrap_tool_call, awrap_tool_call)`` pair :func:`tool_node` installs."""

    def wrap(request: Any, execute: Callable[[Any], Any]) -> Any:
        with tool_scope(request, _node_trajectory(request), tool_classes):
            return execute(request)

    async def awrap(request: Any, execute: Callable[[Any], Awaitable[Any]]) -> Any:
        with tool_scope(request, _node_trajectory(request), tool_classes):
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
    from langgraph.prebuilt import ToolNode

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
