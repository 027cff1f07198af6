"""Pieces shared by the framework integrations: tool classes, live trajectories, activation.

Frameworks run hooks in contexts agentkv does not own (a LangGraph node, an Agents SDK
hook task), so an integration keeps its own table of the trajectories it opened, keyed by
tenant and trajectory id, and makes one *current* only around the framework call it wraps
(:func:`active`). Finishing goes through the trajectory scope, so the events are the
same as with ``agentkv.trajectory()``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from agentkv._guard import internal_error
from agentkv.events._context import (
    Trajectory,
    TrajectoryScope,
    make_current,
    restore_current,
    trajectory,
)
from agentkv.events._decorators import ToolCallScope
from agentkv.events._otel import enter_trajectory, leave_trajectory

__all__ = ["ANY_TENANT", "IDLE_CLASS", "LiveTrajectories", "ToolClasses", "active", "tool_class_of"]

#: How a framework tool name becomes an agentkv tool class: a mapping (names not in it
#: keep their own name), a function of the name, or None (the name is the class).
ToolClasses = Mapping[str, str] | Callable[[str], str] | None


def tool_class_of(tool_classes: ToolClasses, name: str) -> str:
    """The tool class for a tool ``name`` (falls back to the name itself)."""
    try:
        if tool_classes is None:
            value: Any = name
        elif callable(tool_classes):
            value = tool_classes(name)
        else:
            value = tool_classes.get(name, name)
    except Exception as exc:
        internal_error("tool class mapping", exc)
        value = name
    text = value if isinstance(value, str) and value else (name or "tool")
    return text[:256]


@contextmanager
def active(traj: Trajectory | None) -> Iterator[None]:
    """Make ``traj`` the current trajectory for the block (no-op for None), and its
    ``invoke_agent`` span the current span where an ``OTelSink`` is configured."""
    if traj is None:
        yield
        return
    token = make_current(traj)
    span_token = None
    try:
        span_token = enter_trajectory(traj)
    except Exception as exc:
        internal_error("invoke_agent span", exc)
    try:
        yield
    finally:
        leave_trajectory(span_token)
        with suppress(ValueError):  # reset from another context: leave that context alone
            restore_current(token)


#: The pseudo tool class of the time between two runs of one conversation (a person
#: reading and typing): learned and advised like any tool gap, never a release.
IDLE_CLASS = "human"


@dataclass
class _Entry:
    traj: Trajectory
    scope: TrajectoryScope | None  # None: the user opened it; never finished here
    idle: ToolCallScope | None = None  # set while the conversation waits between runs
    idle_since_s: float = 0.0


#: A live table's key: (tenant, trajectory id). One process may serve several tenants,
#: and two of them may use the same id (a LangGraph ``thread_id`` "1", a job "job-1").
_Key = tuple[str | None, str]

#: ``tenant=ANY_TENANT`` in a lookup: the one trajectory with that id, whatever its
#: tenant (None when two tenants hold the id: a caller that cannot tell them apart gets
#: neither).
ANY_TENANT: Any = object()


class LiveTrajectories:
    """Trajectories an integration opened (or borrowed), by (tenant, id); bounded,
    thread-safe.

    A *conversation* (a LangGraph ``thread_id``, an Agents SDK ``group_id``) is one
    trajectory across runs: :meth:`pause` at the end of a run leaves it open and starts
    the idle pseudo-tool (:data:`IDLE_CLASS`), and :meth:`open` of the same id under the
    same tenant resumes it (turn numbers continue; ``tool_finished`` of the idle tool).
    The same id under another tenant is another conversation: a tenant never resumes,
    pauses or finishes another's. It ends only by :meth:`finish` (an explicit end, a
    deleted thread) or by :meth:`sweep` after ``idle_ttl_s`` without a run. ``max_live``
    bounds the table: a run that never reaches its end hook is forgotten, oldest first,
    without an event.
    """

    def __init__(self, max_live: int = 10_000, *, idle_ttl_s: float = 3600.0) -> None:
        self._lock = threading.Lock()
        self._live: OrderedDict[_Key, _Entry] = OrderedDict()
        self._tenants: dict[str, set[str | None]] = {}  # id -> the tenants holding it
        self.max_live = max_live
        self.idle_ttl_s = idle_ttl_s

    def __contains__(self, traj: object) -> bool:
        if not isinstance(traj, Trajectory):
            return False
        entry = self._live.get((traj.tenant, traj.trajectory_id))
        return entry is not None and entry.traj is traj and entry.scope is not None

    def __len__(self) -> int:
        return len(self._live)

    def _resolve(self, trajectory_id: str | None, tenant: Any) -> _Key | None:
        if not isinstance(trajectory_id, str):
            return None
        if tenant is not ANY_TENANT:
            return (tenant, trajectory_id)
        tenants = self._tenants.get(trajectory_id)
        if tenants is None or len(tenants) != 1:
            return None
        return (next(iter(tenants)), trajectory_id)

    def _put(self, key: _Key, entry: _Entry) -> None:  # under the lock
        self._live[key] = entry
        self._tenants.setdefault(key[1], set()).add(key[0])
        while len(self._live) > self.max_live:
            old, _ = self._live.popitem(last=False)
            self._forget(old)

    def _forget(self, key: _Key) -> None:  # under the lock, after popping ``key``
        tenants = self._tenants.get(key[1])
        if tenants is not None:
            tenants.discard(key[0])
            if not tenants:
                del self._tenants[key[1]]

    def holds(self, trajectory_id: str) -> bool:
        """Whether a trajectory with this id is live here under any tenant."""
        return bool(self._tenants.get(trajectory_id))

    def get(self, trajectory_id: str | None, tenant: Any = ANY_TENANT) -> Trajectory | None:
        """The live trajectory with this id under ``tenant`` (by default the only one with
        that id), if any."""
        key = self._resolve(trajectory_id, tenant)
        entry = self._live.get(key) if key is not None else None
        return entry.traj if entry is not None else None

    def open(
        self,
        trajectory_id: str,
        *,
        tenant: str | None = None,
        parent: Trajectory | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Trajectory:
        """Open (or resume the live) trajectory ``trajectory_id`` of ``tenant``; the
        integration owns it."""
        self.sweep()
        key = (tenant, trajectory_id)
        with self._lock:
            entry = self._live.get(key)
            if entry is not None and not entry.traj.finished:
                self._live.move_to_end(key)
                idle, entry.idle = entry.idle, None
            else:
                idle = None
                scope = trajectory(trajectory_id, tenant=tenant, parent=parent, metadata=metadata)
                entry = _Entry(scope.trajectory, scope)
                self._put(key, entry)
        if idle is not None:
            idle.__exit__(None, None, None)  # the person came back: tool_finished
        return entry.traj

    def pause(self, traj: Trajectory | str | None, tenant: Any = ANY_TENANT) -> Trajectory | None:
        """End a run but keep the conversation: its KV waits for the next run.

        ``traj`` is the trajectory, or its id (with ``tenant``)."""
        key = self._key_of(traj, tenant)
        entry = self._live.get(key) if key is not None else None
        if entry is None or entry.scope is None or entry.traj.finished or entry.idle is not None:
            return None
        if isinstance(traj, Trajectory) and entry.traj is not traj:
            return None
        idle = ToolCallScope(IDLE_CLASS, "user")
        with active(entry.traj):
            idle.__enter__()
        entry.idle = idle
        entry.idle_since_s = time.monotonic()
        return entry.traj

    def _key_of(self, traj: Trajectory | str | None, tenant: Any) -> _Key | None:
        if isinstance(traj, Trajectory):
            return (traj.tenant, traj.trajectory_id)
        return self._resolve(traj, tenant)

    def sweep(self, now_s: float | None = None) -> int:
        """Finish conversations idle for longer than ``idle_ttl_s``; how many ended."""
        now = time.monotonic() if now_s is None else now_s
        stale = [
            e.traj
            for e in list(self._live.values())
            if e.idle is not None and now - e.idle_since_s > self.idle_ttl_s
        ]
        for traj in stale:
            self.finish(traj)
        return len(stale)

    def clear(self) -> None:
        """Forget every entry without an event, and restore the default idle TTL (tests,
        process reset)."""
        with self._lock:
            self._live.clear()
            self._tenants.clear()
            self.idle_ttl_s = 3600.0

    def borrow(self, traj: Trajectory) -> None:
        """Track a trajectory the user opened, so lookups by id find it (never finished)."""
        key = (traj.tenant, traj.trajectory_id)
        with self._lock:
            entry = self._live.get(key)
            if entry is None or entry.traj is not traj:
                self._put(key, _Entry(traj, None))

    def finish(
        self,
        traj: Trajectory | str | None,
        exc: BaseException | None = None,
        *,
        tenant: Any = ANY_TENANT,
    ) -> Trajectory | None:
        """End a trajectory: ``trajectory_finished`` (ok / error) or ``trajectory_cancelled``.

        ``traj`` is the trajectory, or its id (with ``tenant``). Borrowed trajectories are
        only forgotten; their owner ends them.
        """
        with self._lock:
            key = self._key_of(traj, tenant)
            entry = self._live.get(key) if key is not None else None
            if entry is None or (isinstance(traj, Trajectory) and entry.traj is not traj):
                return None
            del self._live[key]  # type: ignore[arg-type]
            self._forget(key)  # type: ignore[arg-type]
        found = entry.traj
        if entry.idle is not None:
            entry.idle.__exit__(None, None, None)
            entry.idle = None
        if entry.scope is not None and not found.finished:
            entry.scope.__exit__(type(exc) if exc is not None else None, exc, None)
        return found
