"""Event sinks: in memory, JSON Lines on disk, and a user callback.

A sink receives every :class:`~agentkv.TrajectoryEvent` through ``emit(event)`` and must
not slow the harness down. :class:`JsonlSink` therefore writes from its own thread
through a bounded queue: when the queue is full it drops the event and counts it rather
than block the caller.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path

from agentkv.events._schema import TrajectoryEvent

__all__ = ["CallbackSink", "JsonlSink", "MemorySink"]

logger = logging.getLogger("agentkv")


class MemorySink:
    """Keeps events in memory, optionally only the newest ``max_events``.

    ``events`` returns them as a list, oldest first.
    """

    def __init__(self, max_events: int | None = None) -> None:
        if max_events is not None and max_events < 1:
            raise ValueError("max_events must be at least 1 (or None for unbounded)")
        self.max_events = max_events
        self._events: deque[TrajectoryEvent] = deque(maxlen=max_events)

    @property
    def events(self) -> list[TrajectoryEvent]:
        """The stored events, oldest first (a copy)."""
        return list(self._events)

    def emit(self, event: TrajectoryEvent) -> None:
        """Store the event (deque appends are atomic, so any thread may emit)."""
        self._events.append(event)

    def clear(self) -> None:
        """Forget every stored event."""
        self._events.clear()

    def __len__(self) -> int:
        return len(self._events)


class CallbackSink:
    """Calls ``callback(event)`` for each event, on the emitting thread."""

    def __init__(self, callback: Callable[[TrajectoryEvent], object]) -> None:
        if not callable(callback):
            raise TypeError("CallbackSink needs a callable")
        self.callback = callback

    def emit(self, event: TrajectoryEvent) -> None:
        """Pass the event to the callback."""
        self.callback(event)


_ALIASES = {
    name: (field.alias or name) for name, field in TrajectoryEvent.model_fields.items()
}
_dumps = json.JSONEncoder(separators=(",", ":")).encode


def _event_line(event: TrajectoryEvent) -> str:
    """One JSON line of the event's wire form (same keys as ``to_wire``, built directly)."""
    wire = {_ALIASES[k]: v for k, v in event.__dict__.items() if v is not None}
    wire["turnId"] = str(wire["turnId"])  # a string on the wire, as the contract says
    return _dumps(wire) + "\n"


def _whole_lines(lines: list[str], landed_bytes: int) -> int:
    """How many of ``lines`` (written in order) lie whole in the first ``landed_bytes``."""
    if landed_bytes <= 0:
        return 0
    done = 0
    for line in lines:
        landed_bytes -= len(line.encode("utf-8"))
        if landed_bytes < 0:
            break
        done += 1
    return done


_open_sinks: weakref.WeakSet[JsonlSink] = weakref.WeakSet()


@atexit.register
def _close_open_sinks() -> None:  # pragma: no cover - runs at interpreter exit
    for sink in list(_open_sinks):
        sink.close(timeout_s=2.0)


class JsonlSink:
    """Appends one camelCase JSON event per line to ``path``, off the caller's thread.

    ``emit`` never blocks: events go into a bounded buffer (``max_queue``) that a writer
    thread drains in batches every ``interval_s`` or so; when the buffer is full the
    event is dropped and counted in ``dropped``. A path that cannot be written is
    reported once on the ``agentkv`` logger and counted in ``write_errors``; the harness
    carries on. ``flush()`` waits until buffered events are on disk; ``close()`` when
    done (also done at interpreter exit).

    Framing: a batch that finds the file ending in a partial line (a writer killed
    mid-line) starts on a fresh line, so no event merges into the fragment. ``written``
    counts lines that reached the file in full; lines a failed write left out count in
    ``dropped``. With ``max_bytes``, lines that would grow the file past it first
    rotate it to ``<path>.1`` (``<path>.1`` to ``<path>.2`` and so on, keeping
    ``backups`` of them); a batch is split where it would cross the bound, so no file
    exceeds ``max_bytes`` unless one line alone does (that line gets a file of its own). New files are created readable by their owner only (0600).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_queue: int = 10_000,
        interval_s: float = 0.05,
        max_bytes: int | None = None,
        backups: int = 1,
    ) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be at least 1 (or None for no rotation)")
        self.path = Path(path)
        self.max_queue = max_queue
        self.interval_s = interval_s
        self.max_bytes = max_bytes
        self.backups = max(1, backups)
        self.dropped = 0
        self.written = 0
        self.write_errors = 0
        self.rotations = 0
        self._buffer: deque[TrajectoryEvent] = deque()
        self._accepted = 0
        self._handled = 0
        self._wake = threading.Event()
        self._handled_cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        self._reported = False

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name=f"agentkv-jsonl:{self.path.name}", daemon=True
                )
                self._thread.start()
                _open_sinks.add(self)

    def emit(self, event: TrajectoryEvent) -> None:
        """Buffer the event for writing; drop and count it if the buffer is full."""
        if self._closed or len(self._buffer) >= self.max_queue:
            self.dropped += 1
            return
        self._buffer.append(event)
        self._accepted += 1
        if self._thread is None:
            self._ensure_thread()

    def _chunks(self, lines: list[str]) -> list[list[str]]:
        """``lines`` in runs that each fit ``max_bytes`` (a line over it alone), so a
        batch rotates between runs instead of overshooting the bound."""
        if self.max_bytes is None:
            return [lines]
        out: list[list[str]] = [[]]
        size = 0
        for line in lines:
            n = len(line.encode("utf-8"))
            if out[-1] and size + n > self.max_bytes:
                out.append([])
                size = 0
            out[-1].append(line)
            size += n
        return out

    def _write_batch(self, lines: list[str]) -> None:
        data = "".join(lines).encode("utf-8")
        landed = 0  # bytes of ``data`` on disk
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self.max_bytes is not None:
                self._maybe_rotate(len(data))
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.lseek(fd, 0, os.SEEK_END)
                if size and os.lseek(fd, size - 1, os.SEEK_SET) >= 0 and os.read(fd, 1) != b"\n":
                    os.write(fd, b"\n")  # a partial line is left alone, ours starts fresh
                view = memoryview(data)
                while landed < len(data):
                    landed += os.write(fd, view[landed:])
            finally:
                os.close(fd)
        except OSError as exc:
            self.write_errors += 1
            if not self._reported:
                self._reported = True
                logger.warning(
                    "agentkv: cannot write events to %s (%s); events are dropped", self.path, exc
                )
        done = _whole_lines(lines, landed)
        self.written += done
        self.dropped += len(lines) - done

    def _maybe_rotate(self, incoming: int) -> None:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        assert self.max_bytes is not None
        if size == 0 or size + incoming <= self.max_bytes:
            return
        for i in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{i}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{i + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self.rotations += 1

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            lines: list[str] = []
            while self._buffer:
                event = self._buffer.popleft()
                lines.append(_event_line(event))
            if lines:
                for chunk in self._chunks(lines):
                    self._write_batch(chunk)
                with self._handled_cond:
                    self._handled += len(lines)
                    self._handled_cond.notify_all()
            if self._closed and not self._buffer:
                return

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every buffered event is written; False if it took over ``timeout_s``."""
        if self._thread is None:
            return True
        target = self._accepted
        self._wake.set()
        with self._handled_cond:
            return self._handled_cond.wait_for(lambda: self._handled >= target, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is buffered, then stop the writer thread."""
        if self._closed:
            return
        self.flush(timeout_s)
        self._closed = True
        thread = self._thread
        if thread is not None:
            self._wake.set()
            thread.join(timeout_s)
        _open_sinks.discard(self)
