"""The process-wide event pipeline: sinks, internal listeners and error containment.

Every event agentkv produces goes through :func:`emit`, which hands it to the configured
sinks (user-facing: memory, JSONL, OpenTelemetry, callbacks), to internal listeners (the
gap learner, a client's lifecycle channel) and to active capture scopes. None of this
may break the caller (invariant 1): a failing sink goes to
:func:`agentkv._guard.internal_error` (logged once, counted, skipped; raised in strict
mode) and the next sink still gets the event.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentkv._guard import internal_error
from agentkv._models import TrajectoryEvent

if TYPE_CHECKING:
    from agentkv._gaps import GapModel

__all__ = [
    "Sink",
    "emit",
    "get_gap_model",
    "subscribe",
    "wanted",
]


@runtime_checkable
class Sink(Protocol):
    """Anything that receives events: ``emit(event)``; ``close()`` is optional."""

    def emit(self, event: TrajectoryEvent) -> None:
        """Receive one event. Must not block the caller for long."""


class _State:
    """Mutable process state, swapped wholesale by ``configure`` (copy-on-write lists)."""

    def __init__(self) -> None:
        self.sinks: tuple[Any, ...] = ()
        self.listeners: tuple[Callable[[TrajectoryEvent], None], ...] = ()
        self.captures: tuple[list[TrajectoryEvent], ...] = ()
        self.learn_gaps: bool = True
        self.gap_model: GapModel | None = None
        self.lock = threading.Lock()


_state = _State()


def subscribe(listener: Callable[[TrajectoryEvent], None]) -> Callable[[], None]:
    """Register an internal listener; returns a function that unregisters it."""
    with _state.lock:
        _state.listeners = (*_state.listeners, listener)

    def unsubscribe() -> None:
        with _state.lock:
            _state.listeners = tuple(x for x in _state.listeners if x is not listener)

    return unsubscribe


def _add_capture(buffer: list[TrajectoryEvent]) -> None:
    with _state.lock:
        _state.captures = (*_state.captures, buffer)


def _remove_capture(buffer: list[TrajectoryEvent]) -> None:
    with _state.lock:
        _state.captures = tuple(x for x in _state.captures if x is not buffer)


def get_gap_model() -> GapModel | None:
    """The process's learning gap model (created on first use unless learning is off).

    Queued tool durations are folded in before it is returned.
    """
    if not _state.learn_gaps:
        return None
    model = _state.gap_model
    if model is None:
        try:
            from agentkv._gaps import GapModel
        except ImportError:  # pragma: no cover - the gap module ships with agentkv
            _state.learn_gaps = False
            return None
        with _state.lock:
            if _state.gap_model is None:
                namespace = os.environ.get("AGENTKV_GAPS_NAMESPACE", "").strip()
                # With a namespace the learner persists under AGENTKV_HOME and merges with
                # what other processes of the same application learned.
                _state.gap_model = (
                    GapModel(store=True, namespace=namespace) if namespace else GapModel()
                )
            model = _state.gap_model
    if _pending_tool_samples:
        _drain_tool_samples(model)
    return model


def wanted(kind: str) -> bool:
    """Cheap check for hot paths: does anybody consume events of this kind?

    Tool durations reach the gap learner through :func:`learn_tool_duration` instead of
    events, so with no sink only ``model_started`` is needed (it carries the idle gap).
    """
    s = _state
    if s.sinks or s.listeners or s.captures:
        return True
    return s.learn_gaps and kind == "model_started"


_pending_tool_samples: deque[tuple[str, float, float]] = deque(maxlen=100_000)


def learn_tool_duration(tool_class: str, duration_s: float) -> None:
    """Queue a tool duration for the gap learner (folded in lazily, off the hot path)."""
    if _state.learn_gaps:
        _pending_tool_samples.append((tool_class, duration_s, time.time()))


def _drain_tool_samples(model: GapModel) -> None:
    pending = _pending_tool_samples
    while pending:
        try:
            tool_class, duration_s, at = pending.popleft()
        except IndexError:  # drained by another thread
            return
        model.observe(tool_class, duration_s, at=at, kind="tool")


def emit(event: TrajectoryEvent) -> None:
    """Deliver ``event`` to captures, sinks, listeners and the gap learner."""
    s = _state
    for buffer in s.captures:
        buffer.append(event)
    for sink in s.sinks:
        try:
            sink.emit(event)
        except Exception as exc:
            internal_error(f"sink {type(sink).__name__}", exc)
    for listener in s.listeners:
        try:
            listener(event)
        except Exception as exc:
            internal_error(f"listener {getattr(listener, '__qualname__', listener)}", exc)
    if s.learn_gaps and event.event == "model_started":
        try:
            model = get_gap_model()
            if model is not None:
                model.emit(event)
        except Exception as exc:
            internal_error("gap learning", exc)


def _apply_env() -> None:
    """Apply ``AGENTKV_JSONL`` and ``AGENTKV_LEARN_GAPS`` once, when agentkv first loads."""
    path = os.environ.get("AGENTKV_JSONL")
    if path:
        from agentkv._sinks import JsonlSink

        _state.sinks = (*_state.sinks, JsonlSink(path))
    if os.environ.get("AGENTKV_LEARN_GAPS", "").strip().lower() in {"0", "false", "no", "off"}:
        _state.learn_gaps = False


_apply_env()
