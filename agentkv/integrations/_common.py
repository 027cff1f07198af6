"""Pieces shared by the framework integrations: tool classes, live trajectories, activation.

Frameworks run hooks in contexts agentkv does not own (a LangGraph node, an Agents SDK
hook task), so an integration keeps its own table of the trajectories it opened, keyed by
trajectory id, and makes one *current* only around the framework call it wraps
(:func:`active`). Finishing goes through the trajectory scope, so the events are the
same as with ``agentkv.trajectory()``.
"""

from __future__ import annotations

import threading
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
from agentkv.events._otel import enter_trajectory, leave_trajectory

__all__ = ["LiveTrajectories", "ToolClasses", "active", "tool_class_of"]

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


@dataclass
class _Entry:
    traj: Trajectory
    scope: TrajectoryScope | None  # None: the user opened it; never finished here


class LiveTrajectories:
    """Trajectories an integration opened (or borrowed), by id; bounded, thread-safe.

    ``max_live`` bounds the table: a run that never reaches its end hook (a crash, an
    interrupted graph that is never resumed) is forgotten, oldest first, without an
    event.
    """

    def __init__(self, max_live: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._live: OrderedDict[str, _Entry] = OrderedDict()
        self.max_live = max_live

    def __contains__(self, traj: object) -> bool:
        if not isinstance(traj, Trajectory):
            return False
        entry = self._live.get(traj.trajectory_id)
        return entry is not None and entry.traj is traj and entry.scope is not None

    def __len__(self) -> int:
        return len(self._live)

    def get(self, trajectory_id: str | None) -> Trajectory | None:
        """The live trajectory with this id, if any."""
        if trajectory_id is None:
            return None
        entry = self._live.get(trajectory_id)
        return entry.traj if entry is not None else None

    def open(
        self,
        trajectory_id: str,
        *,
        tenant: str | None = None,
        parent: Trajectory | str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Trajectory:
        """Open (or return the live) trajectory ``trajectory_id``; the integration owns it."""
        with self._lock:
            entry = self._live.get(trajectory_id)
            if entry is not None and not entry.traj.finished:
                self._live.move_to_end(trajectory_id)
                return entry.traj
            scope = trajectory(trajectory_id, tenant=tenant, parent=parent, metadata=metadata)
            self._live[trajectory_id] = _Entry(scope.trajectory, scope)
            while len(self._live) > self.max_live:
                self._live.popitem(last=False)
            return scope.trajectory

    def borrow(self, traj: Trajectory) -> None:
        """Track a trajectory the user opened, so lookups by id find it (never finished)."""
        with self._lock:
            entry = self._live.get(traj.trajectory_id)
            if entry is None or entry.traj is not traj:
                self._live[traj.trajectory_id] = _Entry(traj, None)

    def finish(
        self, trajectory_id: str | None, exc: BaseException | None = None
    ) -> Trajectory | None:
        """End a trajectory: ``trajectory_finished`` (ok / error) or ``trajectory_cancelled``.

        Borrowed trajectories are only forgotten; their owner ends them.
        """
        if trajectory_id is None:
            return None
        with self._lock:
            entry = self._live.pop(trajectory_id, None)
        if entry is None:
            return None
        traj = entry.traj
        if entry.scope is not None and not traj.finished:
            entry.scope.__exit__(type(exc) if exc is not None else None, exc, None)
        return traj
