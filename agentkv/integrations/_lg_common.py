"""LangGraph pieces shared by the middleware, the callback handler and the hand-built graph
helpers: thread ids, the conversation table, child ids, the model-client wrapper and the
scope around one model or tool call.

Nothing here imports LangChain or LangGraph at import time (``langgraph.errors`` is read
only when a call fails), so the callback handler imports with langchain-core alone.

A LangGraph ``thread_id`` names a conversation, and a conversation is *one* trajectory
across ``invoke`` calls: turn numbers continue, and the time between two runs is the
idle pseudo-tool ``human`` (learned and advised like any gap; never a release). A
conversation ends, and its KV is released, only when:

- the application says so: :func:`end_thread` (or ``handler.end_thread``);
- its thread is deleted from a checkpointer passed to :func:`watch_checkpointer`;
- it sat idle for longer than the table's ``idle_ttl_s`` (default one hour; checked
  whenever a run starts), or the server's own lease TTL ran out first.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
from collections.abc import Mapping
from contextlib import AbstractContextManager, ExitStack, nullcontext
from types import TracebackType
from typing import Any

from agentkv._guard import internal_error
from agentkv.client._wrap import wrap_openai
from agentkv.events._context import Trajectory, register_resolver
from agentkv.events._decorators import tool_call
from agentkv.integrations._common import (
    ANY_TENANT,
    LiveTrajectories,
    ToolClasses,
    active,
    tool_class_of,
)

__all__ = [
    "CONVERSATIONS",
    "STATE_KEY",
    "CallScope",
    "child_trajectory_id",
    "end_thread",
    "fit_id",
    "is_interrupt",
    "is_wrapped",
    "short_hash",
    "state_get",
    "tool_scope",
    "trajectory_id_for",
    "watch_checkpointer",
    "wrap_chat_openai",
]

#: The private agent-state key holding the run's trajectory id (the middleware's).
STATE_KEY = "agentkv_trajectory_id"

_MAX_ID = 256
#: One table for every middleware and handler instance, so a subagent built with its
#: own middleware still finds the caller's trajectory, and a thread is one conversation.
CONVERSATIONS = LiveTrajectories()


def fit_id(trajectory_id: str) -> str:
    """``trajectory_id`` cut to the 256-character limit (a hash keeps it unique)."""
    if len(trajectory_id) <= _MAX_ID:
        return trajectory_id
    digest = hashlib.sha256(trajectory_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return trajectory_id[: _MAX_ID - 18] + "~" + digest


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def child_trajectory_id(parent_id: str, name: str, key: str) -> str:
    """The id of a subagent run under ``parent_id``: ``<parent>/<name>-<hash8 of key>``.

    ``key`` tells two children of one parent apart (the caller's checkpoint namespace,
    a tool call id); the same key gives the same id, so a resumed subagent keeps it.
    """
    return fit_id(f"{parent_id}/{name[:64]}-{short_hash(key)}")


def trajectory_id_for(config: Mapping[str, Any] | None) -> str | None:
    """The trajectory id a graph run with ``config`` gets: its ``thread_id`` (or None)."""
    if not config:
        return None
    configurable = config.get("configurable") or {}
    thread_id = configurable.get("thread_id")
    if thread_id is None:
        thread_id = (config.get("metadata") or {}).get("thread_id")
    if thread_id is None or thread_id == "":
        return None
    return fit_id(str(thread_id))


def end_thread(thread_id: str, *, tenant: str | None = None) -> bool:
    """End the conversation of ``thread_id``: ``trajectory_finished``, its KV released.

    True when a live conversation was ended. ``tenant`` names the conversation's tenant;
    it is needed only where several tenants of one process use the same thread id (then,
    without it, none is ended).
    """
    which = ANY_TENANT if tenant is None else tenant
    return CONVERSATIONS.finish(fit_id(str(thread_id)), tenant=which) is not None


def watch_checkpointer(checkpointer: Any) -> Any:
    """End a thread's conversation when ``checkpointer`` deletes the thread; returns it.

    Wraps ``delete_thread`` / ``adelete_thread`` of this checkpointer instance only.
    """
    for name in ("delete_thread", "adelete_thread"):
        orig = getattr(checkpointer, name, None)
        if orig is None or getattr(orig, "__agentkv_watch__", False):
            continue
        if inspect.iscoroutinefunction(orig):

            @functools.wraps(orig)
            async def adelete(thread_id: str, *a: Any, _orig: Any = orig, **k: Any) -> Any:
                try:
                    return await _orig(thread_id, *a, **k)
                finally:
                    end_thread(thread_id)

            wrapper: Any = adelete
        else:

            @functools.wraps(orig)
            def delete(thread_id: str, *a: Any, _orig: Any = orig, **k: Any) -> Any:
                try:
                    return _orig(thread_id, *a, **k)
                finally:
                    end_thread(thread_id)

            wrapper = delete
        wrapper.__agentkv_watch__ = True
        setattr(checkpointer, name, wrapper)
    return checkpointer


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


def is_wrapped(llm: Any) -> bool:
    """Whether one of ``llm``'s OpenAI clients carries agentkv's wrapper."""
    for attr in ("root_client", "root_async_client"):
        client = getattr(llm, attr, None)
        if client is not None and vars(client).get("_agentkv_state") is not None:
            return True
    return False


def state_get(state: Any, key: str) -> Any:
    """``state[key]`` of a mapping state, ``state.key`` of an object (None when absent)."""
    if isinstance(state, Mapping):
        return state.get(key)
    return getattr(state, key, None)


def is_interrupt(error: BaseException) -> bool:
    """Whether ``error`` is LangGraph's interrupt (``GraphBubbleUp``): a pause, not a failure."""
    module = sys.modules.get("langgraph.errors")
    if module is None:  # LangChain without LangGraph (or LangGraph never ran): no interrupts
        return False
    return isinstance(error, module.GraphBubbleUp)


def _is_decorated_tool(tool: Any) -> bool:
    for attr in ("func", "coroutine"):
        if getattr(getattr(tool, attr, None), "__agentkv_tool__", None) is not None:
            return True
    return False


class CallScope:
    """Around one model or tool call: current trajectory, its events, errors end the run.

    An error leaving the call finishes the trajectory (status ``error``) when the
    conversation table owns it; an interrupt leaves it open.
    """

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
        if exc is None or traj is None or is_interrupt(exc):
            return
        if traj in CONVERSATIONS:  # only trajectories an integration opened
            CONVERSATIONS.finish(traj, exc)


def tool_scope(request: Any, traj: Trajectory | None, tool_classes: ToolClasses) -> CallScope:
    """The scope of one LangGraph tool call request: a tool event pair with its class
    (none for a tool decorated with ``@agentkv.tool``, which has its own)."""
    inner: AbstractContextManager[Any] = nullcontext()
    if traj is not None:
        try:
            if not _is_decorated_tool(getattr(request, "tool", None)):
                name = str(request.tool_call.get("name") or "tool")[:256]
                inner = tool_call(tool_class_of(tool_classes, name), name=name)
        except Exception as exc:
            internal_error("langgraph tool instrumentation", exc)
    return CallScope(traj, inner)


def _from_runnable_config() -> Trajectory | None:
    """The trajectory of the LangChain run the current context belongs to, if any.

    LangChain keeps the running runnable's config in a context variable; its callback
    manager names the parent run (which an agentkv handler tracks) and its metadata the
    thread. So a wrapped client called inside a graph finds its trajectory without
    agentkv owning the context.
    """
    module = sys.modules.get("langchain_core.runnables.config")
    if module is None:
        return None
    config = module.var_child_runnable_config.get()
    if not config:
        return None
    callbacks = config.get("callbacks")
    parent = getattr(callbacks, "parent_run_id", None)
    handlers = getattr(callbacks, "handlers", None)
    if handlers is None:
        handlers = callbacks if isinstance(callbacks, list) else ()
    for handler in handlers:
        find = getattr(handler, "agentkv_trajectory_of", None)
        if find is not None:
            traj: Trajectory | None = find(parent)
            if traj is not None:
                return traj
    return CONVERSATIONS.get(trajectory_id_for(config))


register_resolver(_from_runnable_config)
