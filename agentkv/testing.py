"""Helpers for testing code instrumented with agentkv.

``capture_events()`` records every event emitted while it is active, whatever sinks are
configured::

    from agentkv.testing import capture_events

    with capture_events() as events:
        run_my_agent()
    assert [e.event for e in events][-1] == "trajectory_finished"
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from agentkv import _runtime
from agentkv._models import TrajectoryEvent

__all__ = ["capture_events"]


@contextmanager
def capture_events() -> Iterator[list[TrajectoryEvent]]:
    """Yield a list that receives every event emitted (from any thread) inside the block."""
    events: list[TrajectoryEvent] = []
    _runtime._add_capture(events)
    try:
        yield events
    finally:
        _runtime._remove_capture(events)
