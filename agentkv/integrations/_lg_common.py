"""LangGraph pieces shared by the middleware and the callback handler: thread ids and the
conversation table.

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
from typing import Any

from agentkv.events._context import Trajectory, register_resolver
from agentkv.integrations._common import ANY_TENANT, LiveTrajectories

__all__ = [
    "CONVERSATIONS",
    "end_thread",
    "fit_id",
    "short_hash",
    "trajectory_id_for",
    "watch_checkpointer",
]

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
