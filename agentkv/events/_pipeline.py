"""The process-wide event pipeline: sinks, internal listeners, captures and the gap learner.

Every event agentkv produces goes through :func:`emit`, which hands it to the configured
sinks (user-facing: memory, JSONL, OpenTelemetry, callbacks), to internal listeners (a
client's lifecycle channel), to active capture scopes and to the process's gap learner.
None of this may break the caller (invariant 1): a failing sink goes to
:func:`agentkv._guard.internal_error` (logged once, counted, skipped; raised in strict
mode) and the next sink still gets the event.

The state lives here and changes only through this module's functions
(``agentkv.configure`` and ``agentkv.testing.reset`` use them). Lists are copied on
write, so :func:`emit` reads them without a lock.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentkv._guard import internal_error
from agentkv.events._schema import TrajectoryEvent

if TYPE_CHECKING:
    from agentkv.gaps._model import GapModel

__all__ = [
    "Listener",
    "Sink",
    "add_capture",
    "current_gap_model",
    "emit",
    "ensure_gap_model",
    "get_sinks",
    "has_consumers",
    "is_subscribed",
    "learn_model_call",
    "learn_tool_duration",
    "learns_gaps",
    "listener_flushes",
    "remove_capture",
    "reset",
    "set_gap_model",
    "set_learn_gaps",
    "set_sinks",
    "subscribe",
    "wanted",
]

Listener = Callable[[TrajectoryEvent], None]


@runtime_checkable
class Sink(Protocol):
    """Anything that receives events: ``emit(event)``; ``close()`` is optional."""

    def emit(self, event: TrajectoryEvent) -> None:
        """Receive one event. Must not block the caller for long."""


class _State:
    """Mutable process state, swapped wholesale by ``configure`` (copy-on-write lists)."""

    def __init__(self) -> None:
        self.sinks: tuple[Any, ...] = ()
        self.listeners: tuple[Listener, ...] = ()
        self.flushes: tuple[tuple[Listener, Callable[[float], bool]], ...] = ()
        self.captures: tuple[list[TrajectoryEvent], ...] = ()
        self.learn_gaps: bool = True
        self.gap_model: GapModel | None = None
        self.lock = threading.Lock()


_state = _State()
_pending_tool_samples: deque[tuple[str, float, float]] = deque(maxlen=100_000)


# --- sinks, listeners, captures -----------------------------------------------------------
def set_sinks(sinks: Iterable[Any]) -> None:
    """Replace the configured sinks (checked by the caller)."""
    _state.sinks = tuple(sinks)


def get_sinks() -> tuple[Any, ...]:
    """The configured sinks, in order."""
    return _state.sinks


def subscribe(
    listener: Listener, *, flush: Callable[[float], bool] | None = None
) -> Callable[[], None]:
    """Register an internal listener; returns a function that unregisters it.

    ``flush(timeout_s) -> bool``, when given, is called by ``agentkv.flush()`` to deliver
    what the listener has queued.
    """
    with _state.lock:
        _state.listeners = (*_state.listeners, listener)
        if flush is not None:
            _state.flushes = (*_state.flushes, (listener, flush))

    def unsubscribe() -> None:
        with _state.lock:
            _state.listeners = tuple(x for x in _state.listeners if x is not listener)
            _state.flushes = tuple(x for x in _state.flushes if x[0] is not listener)

    return unsubscribe


def is_subscribed(listener: Listener) -> bool:
    """True when ``listener`` (or an equal bound method) is registered."""
    return listener in _state.listeners


def listener_flushes() -> tuple[Callable[[float], bool], ...]:
    """The flush functions that listeners registered, in order."""
    return tuple(fn for _, fn in _state.flushes)


def add_capture(buffer: list[TrajectoryEvent]) -> None:
    """Append every event emitted from now on to ``buffer`` (see ``agentkv.testing``)."""
    with _state.lock:
        _state.captures = (*_state.captures, buffer)


def remove_capture(buffer: list[TrajectoryEvent]) -> None:
    """Stop capturing into ``buffer``."""
    with _state.lock:
        _state.captures = tuple(x for x in _state.captures if x is not buffer)


# --- the gap learner ----------------------------------------------------------------------
def set_learn_gaps(learn: bool) -> None:
    """Turn the process's gap learner on or off."""
    _state.learn_gaps = learn


def learns_gaps() -> bool:
    """True when the process learns tool gaps."""
    return _state.learn_gaps


def set_gap_model(model: GapModel | None) -> None:
    """Use ``model`` as the process's learner (None: make one on first use)."""
    _state.gap_model = model


def current_gap_model() -> GapModel | None:
    """The process's learner if there is one now (never creates one)."""
    return _state.gap_model


def ensure_gap_model() -> GapModel | None:
    """The process's learner, created on first use (None while learning is off).

    Tool durations queued by :func:`learn_tool_duration` are folded in before it is
    returned.
    """
    if not _state.learn_gaps:
        return None
    model = _state.gap_model
    if model is None:
        try:
            from agentkv.gaps._model import GapModel
        except ImportError:  # pragma: no cover - the gap module ships with agentkv
            _state.learn_gaps = False
            return None
        with _state.lock:
            if _state.gap_model is None:
                _state.gap_model = _make_learner(GapModel)
            model = _state.gap_model
    if _pending_tool_samples:
        _drain_tool_samples(model)
    return model


def _make_learner(cls: type[GapModel]) -> GapModel:
    """The process's learner: the shipped per-family priors, persisted under
    ``AGENTKV_HOME`` in namespace ``AGENTKV_GAPS_NAMESPACE`` (default ``default``) and
    merged with what other processes learned, unless ``AGENTKV_GAPS_PERSIST=0``."""
    from agentkv.gaps._priors import default_priors

    namespace = os.environ.get("AGENTKV_GAPS_NAMESPACE", "").strip() or "default"
    persist = os.environ.get("AGENTKV_GAPS_PERSIST", "1").strip().lower()
    priors = default_priors()
    if persist in ("0", "false", "no", "off"):
        return cls(priors=priors)
    # opened and read on its own thread: the model call that made the learner never
    # waits for the store (a large one took tens of ms)
    return cls(store=True, namespace=namespace, priors=priors, open_in_background=True)


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


# --- delivery -----------------------------------------------------------------------------
def wanted(kind: str) -> bool:
    """Cheap check for hot paths: does anybody consume events of this kind?

    Tool durations reach the gap learner through :func:`learn_tool_duration` instead of
    events, so with no sink only ``model_started`` is needed (it carries the idle gap).
    """
    s = _state
    if s.sinks or s.listeners or s.captures:
        return True
    return s.learn_gaps and kind == "model_started"


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
            model = ensure_gap_model()
            if model is not None:
                model.emit(event)
        except Exception as exc:
            internal_error("gap learning", exc)


def has_consumers() -> bool:
    """Does anything besides the gap learner take events (a sink, listener or capture)?"""
    s = _state
    return bool(s.sinks or s.listeners or s.captures)


def learn_model_call(
    trajectory_id: str,
    after_tool_class: str | None,
    idle_gap_ms: float | None,
    emitted_at_ms: int,
) -> None:
    """What :func:`emit` does with a ``model_started`` event, without making the event.

    For hot paths when :func:`has_consumers` is false: only the gap learner would see it
    (:meth:`agentkv.GapModel.learn_call`; ``idle_gap_ms`` None for a trajectory's first
    call).
    """
    s = _state
    if not s.learn_gaps:
        return
    try:
        model = s.gap_model  # ensure_gap_model()'s answer when it has nothing to do
        if model is None or _pending_tool_samples:
            model = ensure_gap_model()
        if model is not None:
            model.learn_call(trajectory_id, after_tool_class, idle_gap_ms, emitted_at_ms)
    except Exception as exc:
        internal_error("gap learning", exc)


# --- set-up -------------------------------------------------------------------------------
def _apply_env() -> None:
    """Apply ``AGENTKV_JSONL`` and ``AGENTKV_LEARN_GAPS`` (when agentkv first loads)."""
    path = os.environ.get("AGENTKV_JSONL")
    if path:
        from agentkv.events._sinks import JsonlSink

        _state.sinks = (*_state.sinks, JsonlSink(path))
    if os.environ.get("AGENTKV_LEARN_GAPS", "").strip().lower() in {"0", "false", "no", "off"}:
        _state.learn_gaps = False


def reset() -> None:
    """Back to a fresh process: no sinks, listeners or captures, no gap model, no queued
    tool durations; ``AGENTKV_JSONL`` / ``AGENTKV_LEARN_GAPS`` applied again."""
    global _state
    _state = _State()
    _pending_tool_samples.clear()
    _apply_env()


_apply_env()
