"""Helpers for testing code instrumented with agentkv.

``capture_events()`` records every event emitted while it is active, whatever sinks are
configured::

    from agentkv.testing import capture_events

    with capture_events() as events:
        run_my_agent()
    assert [e.event for e in events][-1] == "trajectory_finished"

``reset()`` puts agentkv's process state back as a fresh import leaves it (call it
between tests), and :class:`FakeClock` is a clock that moves only when told to, for
the components that take a ``clock``: ``GapModel(clock=...)`` and the lifecycle channel.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agentkv.events import _pipeline
from agentkv.events._schema import TrajectoryEvent

__all__ = ["FakeClock", "capture_events", "reset"]


@contextmanager
def capture_events() -> Iterator[list[TrajectoryEvent]]:
    """Yield a list that receives every event emitted (from any thread) inside the block."""
    events: list[TrajectoryEvent] = []
    _pipeline.add_capture(events)
    try:
        yield events
    finally:
        _pipeline.remove_capture(events)


def reset() -> None:
    """Forget all of agentkv's process state, as if the process had just imported it.

    Sinks, listeners and capture scopes are dropped; the process gap model and the tool
    durations queued for it are forgotten; contained-error counts, the strict override
    and once-only warnings are cleared; the lifecycle channel is closed (a new one
    starts on next use); turn records and counters are emptied; spans go to the global
    tracer provider again; LangGraph threads and Agents SDK groups are forgotten. Sinks are not closed: they belong to the caller.
    """
    import sys

    from agentkv import _guard
    from agentkv.client import _accounting
    from agentkv.client._lifecycle import reset_channel
    from agentkv.events._otel import set_tracer_provider

    reset_channel()
    _pipeline.reset()
    _guard.reset()
    _accounting.reset()
    set_tracer_provider(None)
    for module, table in (
        ("agentkv.integrations._lg_common", "CONVERSATIONS"),  # LangGraph threads
        ("agentkv.integrations._agents_model", "GROUPS"),  # Agents SDK groups
    ):
        loaded = sys.modules.get(module)
        if loaded is not None:  # forgotten, not finished
            getattr(loaded, table).clear()


class FakeClock:
    """A clock that stands still until :meth:`advance` moves it (wall and monotonic).

    Pass it as ``clock=`` to :class:`agentkv.GapModel` or a lifecycle channel.
    ``start_s`` is the wall-clock time it shows first (seconds since the epoch).
    """

    def __init__(self, start_s: float = 1_800_000_000.0) -> None:
        self._wall_s = float(start_s)
        self._mono_s = 0.0

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        return self._wall_s

    def monotonic(self) -> float:
        """Monotonic seconds (0 at creation)."""
        return self._mono_s

    def advance(self, seconds: float) -> None:
        """Move both clocks forward by ``seconds`` (never back)."""
        if not seconds >= 0:
            raise ValueError(f"a clock only moves forward; got {seconds!r}")
        self._wall_s += seconds
        self._mono_s += seconds

    def __repr__(self) -> str:
        return f"FakeClock(time={self._wall_s}, monotonic={self._mono_s})"
