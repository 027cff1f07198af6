"""Clocks: where the time comes from, so that tests can drive it.

A :class:`Clock` answers two questions: ``time()`` (wall-clock seconds since the epoch,
for times shared with other processes or written to disk) and ``monotonic()`` (seconds
for durations and deadlines in this process). Components that read the time take a
``clock`` argument; :data:`SYSTEM_CLOCK` is the default and
:class:`agentkv.testing.FakeClock` moves only when a test says so. A leaf module.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "WallClock", "as_clock"]


@runtime_checkable
class Clock(Protocol):
    """A source of wall-clock and monotonic time, in seconds."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (durations, deadlines)."""


class SystemClock:
    """The process's clocks: :func:`time.time` and :func:`time.monotonic`."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """Seconds of :func:`time.monotonic`."""
        return time.monotonic()

    def __repr__(self) -> str:
        return "SystemClock()"


class WallClock:
    """A clock whose wall time comes from a function (its monotonic time is the system's)."""

    def __init__(self, wall: Callable[[], float]) -> None:
        self._wall = wall

    def time(self) -> float:
        """Wall-clock seconds since the epoch, from the function."""
        return float(self._wall())

    def monotonic(self) -> float:
        """Seconds of :func:`time.monotonic`."""
        return time.monotonic()


SYSTEM_CLOCK = SystemClock()


def as_clock(clock: Clock | Callable[[], float] | None) -> Clock:
    """``None``: the system clock; a :class:`Clock` as it is; a function of no arguments
    returning wall-clock seconds (``time.time``): that wall time with the system's
    monotonic clock."""
    if clock is None:
        return SYSTEM_CLOCK
    if isinstance(clock, Clock):
        return clock
    if callable(clock):
        return WallClock(clock)
    raise TypeError(f"clock must be a Clock or a function returning seconds, got {clock!r}")
