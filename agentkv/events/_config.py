"""``agentkv.configure``: where events go and how strict agentkv is.

Settings can also come from the environment, read once when agentkv first emits:

- ``AGENTKV_STRICT=1``: internal errors propagate instead of being logged and contained.
- ``AGENTKV_JSONL=PATH``: add a :class:`~agentkv.JsonlSink` writing to PATH.
- ``AGENTKV_LEARN_GAPS=0``: do not learn tool gaps in this process.
- ``AGENTKV_GAPS_NAMESPACE=NAME``: the application namespace learned gaps persist under
  (default ``default``; shared with other processes using the same name; see
  ``agentkv gaps``).
- ``AGENTKV_GAPS_PERSIST=0``: keep learned gaps in memory only (they persist under
  ``AGENTKV_HOME`` by default).
- ``AGENTKV_HOME``: where local state (learned gaps, the tiny model) lives.

Explicit ``configure`` arguments win over the environment.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from agentkv import _guard
from agentkv._errors import ConfigError
from agentkv.events import _metrics, _otel, _pipeline

if TYPE_CHECKING:
    from agentkv.gaps._model import GapModel

__all__ = ["configure", "flush", "settings"]

class _Unchanged:
    def __repr__(self) -> str:
        return "<unchanged>"


_UNSET: Any = _Unchanged()


def _check_sink(sink: object) -> None:
    if not callable(getattr(sink, "emit", None)):
        raise ConfigError(
            f"{type(sink).__name__} is not a sink: a sink needs an emit(event) method "
            "(use agentkv.CallbackSink(fn) to wrap a plain function)"
        )


def configure(
    *,
    sinks: Iterable[object] | None = _UNSET,
    strict: bool | None = _UNSET,
    learn_gaps: bool = _UNSET,
    gap_model: GapModel | None = _UNSET,
    tracer_provider: Any = _UNSET,
    meter_provider: Any = _UNSET,
) -> None:
    """Configure the process-wide event pipeline. Only the arguments given change.

    ``sinks`` replaces the list of sinks (``[]`` removes all); ``strict`` makes internal
    errors propagate (None: follow ``AGENTKV_STRICT``); ``learn_gaps`` turns the local
    gap learner on or off; ``gap_model`` sets the :class:`~agentkv.GapModel` that learns
    from events (for example one opened with persistence); ``tracer_provider`` is the
    OpenTelemetry provider that receives agentkv's spans (the client's ``chat`` spans,
    and :class:`~agentkv.OTelSink`'s unless it is given its own; None: the global one);
    ``meter_provider`` the one that receives agentkv's GenAI metrics
    (``gen_ai.execute_tool.duration``, ``gen_ai.client.operation.duration``,
    ``gen_ai.client.token.usage``; None: the global one).
    """
    if sinks is not _UNSET:
        sink_list = tuple(sinks or ())
        for sink in sink_list:
            _check_sink(sink)
        _pipeline.set_sinks(sink_list)
    if strict is not _UNSET:
        if strict is not None and not isinstance(strict, bool):
            raise ConfigError("strict must be True, False or None")
        _guard.set_strict(strict)
    if learn_gaps is not _UNSET:
        if not isinstance(learn_gaps, bool):
            raise ConfigError("learn_gaps must be True or False")
        _pipeline.set_learn_gaps(learn_gaps)
    if gap_model is not _UNSET:
        if gap_model is not None and not callable(getattr(gap_model, "emit", None)):
            raise ConfigError("gap_model must be an agentkv.GapModel")
        _pipeline.set_gap_model(gap_model)
    if tracer_provider is not _UNSET:
        _otel.set_tracer_provider(tracer_provider)
    if meter_provider is not _UNSET:
        _metrics.set_meter_provider(meter_provider)


def settings() -> dict[str, Any]:
    """The current configuration, for display and debugging."""
    return {
        "sinks": [type(s).__name__ for s in _pipeline.get_sinks()],
        "strict": _guard.is_strict(),
        "learn_gaps": _pipeline.learns_gaps(),
        "errors": _guard.error_counts(),
    }


def flush(timeout_s: float = 5.0) -> bool:
    """Deliver what agentkv has queued: lifecycle events to the server, buffered sink
    events to disk, learned gaps to the local store. True when everything was delivered
    within ``timeout_s`` (a dead server is not waited for beyond that).

    Call it before reading the server's ``/agentkv/v1/stats`` or a JSONL file in a test,
    or at the end of a short script; long-running processes need not call it.
    """
    import time

    deadline = time.monotonic() + timeout_s
    ok = True
    for sink in _pipeline.get_sinks():
        fn = getattr(sink, "flush", None)
        if callable(fn):
            try:
                ok = bool(fn(max(0.0, deadline - time.monotonic()))) and ok
            except Exception as exc:
                _guard.internal_error(f"flush {type(sink).__name__}", exc)
                ok = False
    for flush_listener in _pipeline.listener_flushes():  # the lifecycle channel's queue
        ok = bool(flush_listener(max(0.0, deadline - time.monotonic()))) and ok
    model = _pipeline.current_gap_model()
    if model is not None and getattr(model, "store", None) is not None:
        ok = bool(model.flush()) and ok
    return ok
