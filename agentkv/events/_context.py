"""Trajectory context: which agent run is executing, on ``contextvars``.

A :class:`Trajectory` is one agent run. ``agentkv.trajectory()`` opens one for the
current context (``with`` or ``async with``); asyncio tasks created inside inherit it,
threads do not — wrap the callable with :func:`bind_context` to carry it into a thread
pool. A trajectory opened inside another is a subagent: its parent is recorded.

Turn ids advance once per model call (:func:`begin_model_call`, used by the client
wrapper). Normal exit emits ``trajectory_finished`` (status ``ok``), an exception emits
``trajectory_finished`` with status ``error`` and propagates unchanged, and cancellation
(``asyncio.CancelledError``, ``KeyboardInterrupt``) emits ``trajectory_cancelled`` and
propagates.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from agentkv._guard import internal_error
from agentkv.events import _otel, _pipeline
from agentkv.events._schema import TrajectoryEvent

__all__ = [
    "CANCEL_TYPES",
    "ModelCall",
    "Trajectory",
    "begin_model_call",
    "bind_context",
    "continue_turns",
    "current_trajectory",
    "get_current",
    "make_current",
    "model_call",
    "note_tool",
    "register_resolver",
    "resolve_current",
    "restore_current",
    "trajectory",
]

P = ParamSpec("P")
R = TypeVar("R")

_current: contextvars.ContextVar[Trajectory | None] = contextvars.ContextVar(
    "agentkv_trajectory", default=None
)

#: What ends a scope as cancelled rather than failed.
CANCEL_TYPES: tuple[type[BaseException], ...] = (
    asyncio.CancelledError,
    KeyboardInterrupt,
    GeneratorExit,
)

#: ``current_trajectory()`` without the Python call around it, for hot paths.
get_current: Callable[[], Trajectory | None] = _current.get


class _Inherit:
    def __repr__(self) -> str:
        return "INHERIT"


INHERIT: Any = _Inherit()


_time_ns = time.time_ns


def _event(fields: dict[str, Any]) -> TrajectoryEvent:
    """An event of every field of :class:`TrajectoryEvent` (validated)."""
    return TrajectoryEvent.model_validate(fields)


class Trajectory:
    """One agent run. Created by :func:`trajectory`; read with :func:`current_trajectory`.

    Attributes are safe to read from any thread. ``extras`` is a free dict where
    integrations keep per-trajectory state (the client's last turn record, for example).
    """

    __slots__ = (
        "_last_model_end_ns",
        "_lock",
        "_template",
        "_tool_class_since_model",
        "attained_service_s",
        "critical_path",
        "extras",
        "finished",
        "last_tool_class",
        "metadata",
        "num_model_calls",
        "parent",
        "parent_id",
        "status",
        "tenant",
        "trajectory_id",
        "turn_id",
        "turn_label",
    )

    def __init__(
        self,
        trajectory_id: str,
        *,
        tenant: str | None = None,
        parent: Trajectory | str | None = None,
        metadata: dict[str, Any] | None = None,
        critical_path: bool | None = None,
    ) -> None:
        if not isinstance(trajectory_id, str) or not trajectory_id or len(trajectory_id) > 256:
            raise ValueError("trajectory_id must be a non-empty string of at most 256 characters")
        self.trajectory_id = trajectory_id
        self.parent: Trajectory | None = parent if isinstance(parent, Trajectory) else None
        self.parent_id: str | None = (
            parent.trajectory_id if isinstance(parent, Trajectory) else parent
        )
        if tenant is None and self.parent is not None:
            tenant = self.parent.tenant
        self.tenant: str | None = tenant
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.critical_path = critical_path
        self.turn_id = 0
        self.turn_label: str | None = None
        self.num_model_calls = 0
        self.last_tool_class: str | None = None
        self.finished = False
        self.status: str | None = None
        self.attained_service_s = 0.0
        self.extras: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._last_model_end_ns: int | None = None
        self._tool_class_since_model: str | None = None
        self._template: dict[str, Any] = {
            "trajectory_id": trajectory_id,
            "turn_id": 0,
            "event": "model_started",
            "emitted_at_ms": 0,
            "tool_class": None,
            "expected_next_agent": None,
            "critical_path": critical_path,
            "parent_trajectory_id": self.parent_id,
            "tenant": tenant,
            "status": None,
            "tool_name": None,
            "tool_call_id": None,
            "duration_ms": None,
            "idle_gap_ms": None,
            "after_tool_class": None,
            "prefix_fingerprint": None,
            "turn_index": None,
        }

    def __repr__(self) -> str:
        return (
            f"Trajectory({self.trajectory_id!r}, turn_id={self.turn_id}, "
            f"parent_id={self.parent_id!r}, finished={self.finished})"
        )

    def make_event(self, kind: str, **fields: Any) -> TrajectoryEvent:
        """Build an event of this trajectory (ids, tenant and parent filled in)."""
        base = self._template.copy()
        if self.turn_label is None:
            base["turn_id"] = self.turn_id
        else:  # the harness's own label; the order stays the trajectory's counter
            base["turn_id"] = self.turn_label
            base["turn_index"] = self.turn_id
        base["event"] = kind
        base["emitted_at_ms"] = _time_ns() // 1_000_000
        base.update(fields)
        return _event(base)


class ModelCall:
    """One model call of a trajectory; ``end()`` marks the answer complete (idempotent)."""

    __slots__ = ("_ended", "idle_gap_ms", "model", "started_ns", "trajectory", "turn_id")

    def __init__(
        self,
        traj: Trajectory,
        turn_id: int,
        model: str | None,
        started_ns: int,
        idle_gap_ms: float | None = None,
    ) -> None:
        self.trajectory = traj
        self.turn_id = turn_id
        self.model = model
        self.started_ns = started_ns
        self.idle_gap_ms = idle_gap_ms  # since the previous model call ended (None: first)
        self._ended = False

    def end(self, status: str = "ok") -> None:
        """Record that the answer is complete: starts the KV idle gap clock."""
        if self._ended:
            return
        self._ended = True
        now = time.monotonic_ns()
        traj = self.trajectory
        with traj._lock:
            traj._last_model_end_ns = now
            traj.attained_service_s += (now - self.started_ns) / 1e9


def begin_model_call(
    traj: Trajectory, *, model: str | None = None, turn_label: str | None = None
) -> ModelCall:
    """Start a model call on ``traj``: advance the turn and emit ``model_started``.

    ``turn_label`` (the harness's own turn id) is the ``turn_id`` of this turn's events;
    their ``turn_index`` is still the trajectory's counter.
    """
    now = time.monotonic_ns()
    with traj._lock:
        turn = traj.num_model_calls
        traj.num_model_calls += 1
        traj.turn_id = turn
        traj.turn_label = turn_label
        idle_ms = (
            (now - traj._last_model_end_ns) / 1e6 if traj._last_model_end_ns is not None else None
        )
        after = traj._tool_class_since_model
        traj._tool_class_since_model = None
    try:
        if _pipeline.has_consumers():
            _pipeline.emit(
                traj.make_event(
                    "model_started",
                    turn_id=turn if turn_label is None else turn_label,
                    turn_index=None if turn_label is None else turn,
                    idle_gap_ms=idle_ms,
                    after_tool_class=after,
                )
            )
        else:  # only the gap learner listens: no event to build
            _pipeline.learn_model_call(
                traj.trajectory_id, after, idle_ms, _time_ns() // 1_000_000
            )
    except Exception as exc:
        internal_error("model_started event", exc)
    return ModelCall(traj, turn, model, now, idle_ms)


def continue_turns(traj: Trajectory, num_model_calls: Any) -> bool:
    """Continue ``traj``'s turn count after ``num_model_calls`` earlier model calls.

    For a conversation restored from durable state (a LangGraph thread read back from
    its checkpointer in a new process): the next model call is turn ``num_model_calls``,
    so the server sees a resumed turn, not a new trajectory's turn 0. The count only
    moves forward; anything but a non-negative int is ignored. True when it moved.
    """
    if isinstance(num_model_calls, bool) or not isinstance(num_model_calls, int):
        return False
    with traj._lock:
        if num_model_calls <= traj.num_model_calls:
            return False
        traj.num_model_calls = num_model_calls
        traj.turn_id = num_model_calls - 1
    return True


class _ModelCallScope:
    """``with model_call():`` / ``async with``: a model call on the current trajectory."""

    def __init__(self, model: str | None, turn_label: str | None = None) -> None:
        self._model = model
        self._turn_label = turn_label
        self._call: ModelCall | None = None

    def __enter__(self) -> ModelCall | None:
        traj = _current.get()
        if traj is not None:
            self._call = begin_model_call(traj, model=self._model, turn_label=self._turn_label)
        return self._call

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: Any) -> None:
        if self._call is not None:
            self._call.end("ok" if et is None else "error")

    async def __aenter__(self) -> ModelCall | None:
        return self.__enter__()

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: Any
    ) -> None:
        self.__exit__(et, e, tb)


def model_call(model: str | None = None, *, turn_id: str | None = None) -> _ModelCallScope:
    """Scope one model call on the current trajectory (no-op yielding None outside one).

    ``turn_id`` labels the turn with the harness's own id (``"run-3/turn-7"``): the
    events of this turn carry it as ``turn_id``, and the trajectory's 0-based counter as
    ``turn_index`` (the order). Without it, ``turn_id`` is the counter.
    """
    if turn_id is not None and (not isinstance(turn_id, str) or not turn_id or len(turn_id) > 256):
        raise ValueError("turn_id must be a non-empty string of at most 256 characters")
    return _ModelCallScope(model, turn_id)


def current_trajectory() -> Trajectory | None:
    """The trajectory of the current context, or None outside any."""
    return _current.get()


_resolvers: list[Callable[[], Trajectory | None]] = []


def register_resolver(resolver: Callable[[], Trajectory | None]) -> None:
    """Let an integration name the trajectory of a context agentkv did not set up.

    The client wrapper asks the resolvers when no trajectory is current (for example,
    the LangGraph callback handler's conversation, read from LangChain's runnable
    config). A resolver must be cheap and must not raise.
    """
    if resolver not in _resolvers:
        _resolvers.append(resolver)


def resolve_current() -> Trajectory | None:
    """The current trajectory, else the first one a registered resolver names."""
    traj = _current.get()
    if traj is not None or not _resolvers:
        return traj
    for resolver in _resolvers:
        try:
            traj = resolver()
        except Exception as exc:
            internal_error("trajectory resolver", exc)
            continue
        if traj is not None and not traj.finished:
            return traj
    return None


def make_current(traj: Trajectory) -> contextvars.Token[Trajectory | None]:
    """Make ``traj`` current in this context without opening a scope (no events).

    For integrations that run hooks in contexts they do not own; undo with
    :func:`restore_current`.
    """
    return _current.set(traj)


def restore_current(token: contextvars.Token[Trajectory | None]) -> None:
    """Undo :func:`make_current` (``ValueError`` when called from another context)."""
    _current.reset(token)


def note_tool(traj: Trajectory, tool_class: str) -> None:
    """Record that a tool of ``tool_class`` runs in ``traj`` (for the next model call)."""
    traj.last_tool_class = tool_class
    traj._tool_class_since_model = tool_class


class TrajectoryScope:
    """The object returned by :func:`trajectory`: a sync and async context manager."""

    def __init__(
        self,
        trajectory_id: str | None,
        tenant: str | None,
        parent: Any,
        metadata: dict[str, Any] | None,
        critical_path: bool | None,
    ) -> None:
        if parent is INHERIT:
            parent = _current.get()
        self._traj = Trajectory(
            trajectory_id if trajectory_id is not None else f"traj-{uuid.uuid4().hex}",
            tenant=tenant,
            parent=parent,
            metadata=metadata,
            critical_path=critical_path,
        )
        self._token: contextvars.Token[Trajectory | None] | None = None
        self._span_token: Any = None

    @property
    def trajectory(self) -> Trajectory:
        """The trajectory this scope opens."""
        return self._traj

    def __enter__(self) -> Trajectory:
        if self._token is not None:
            raise RuntimeError("this trajectory scope is already active; open a new one")
        self._token = _current.set(self._traj)
        try:
            self._span_token = _otel.enter_trajectory(self._traj)
        except Exception as exc:
            internal_error("invoke_agent span", exc)
        return self._traj

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        traj = self._traj
        try:
            if exc_type is None:
                kind, status = "trajectory_finished", "ok"
            elif issubclass(exc_type, CANCEL_TYPES):
                kind, status = "trajectory_cancelled", "cancelled"
            else:
                kind, status = "trajectory_finished", "error"
            traj.finished = True
            traj.status = status
            try:
                _pipeline.emit(traj.make_event(kind, status=status))
            except Exception as err:
                internal_error("trajectory end event", err)
        finally:
            span_token, self._span_token = self._span_token, None
            _otel.leave_trajectory(span_token)
            if self._token is not None:
                try:
                    _current.reset(self._token)
                except ValueError:
                    # Exited in another context (e.g. a generator finalized elsewhere).
                    _current.set(traj.parent)
                self._token = None

    async def __aenter__(self) -> Trajectory:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)


def trajectory(
    trajectory_id: str | None = None,
    *,
    tenant: str | None = None,
    parent: Trajectory | str | None = INHERIT,
    metadata: dict[str, Any] | None = None,
    critical_path: bool | None = None,
) -> TrajectoryScope:
    """Open a trajectory (one agent run) for the current context.

    Use as ``with agentkv.trajectory() as traj:`` or ``async with``. ``trajectory_id``
    defaults to a random id; ``tenant`` isolates cache state between tenants; ``parent``
    defaults to the enclosing trajectory (a nested trajectory is a subagent) — pass
    ``None`` for a root, or a parent id string when the parent lives in another process.
    """
    return TrajectoryScope(trajectory_id, tenant, parent, metadata, critical_path)


def bind_context(fn: Callable[P, R]) -> Callable[P, R]:
    """Return ``fn`` bound to a copy of the current context (trajectory included).

    Threads do not inherit ``contextvars``; wrap what you hand to a thread pool::

        pool.submit(agentkv.bind_context(run_tool), arg)
        await loop.run_in_executor(None, agentkv.bind_context(run_tool), arg)
    """
    ctx = contextvars.copy_context()

    @functools.wraps(fn)
    def bound(*args: P.args, **kwargs: P.kwargs) -> R:
        # A Context can be entered by one thread at a time; copy per call.
        return ctx.copy().run(fn, *args, **kwargs)

    return bound
