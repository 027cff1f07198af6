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
import queue
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from agentkv._models import TrajectoryEvent

__all__ = ["CallbackSink", "JsonlSink", "MemorySink"]

logger = logging.getLogger("agentkv")


class MemorySink:
    """Keeps events in a list (``.events``), optionally bounded to the newest ``max_events``."""

    def __init__(self, max_events: int | None = None) -> None:
        if max_events is not None and max_events < 1:
            raise ValueError("max_events must be at least 1 (or None for unbounded)")
        self.max_events = max_events
        self.events: list[TrajectoryEvent] = []
        self._lock = threading.Lock()

    def emit(self, event: TrajectoryEvent) -> None:
        """Store the event."""
        if self.max_events is None:
            self.events.append(event)  # list.append is atomic under the GIL
            return
        with self._lock:
            self.events.append(event)
            if len(self.events) > self.max_events:
                del self.events[: len(self.events) - self.max_events]

    def clear(self) -> None:
        """Forget every stored event."""
        with self._lock:
            self.events.clear()

    def __len__(self) -> int:
        return len(self.events)


class CallbackSink:
    """Calls ``callback(event)`` for each event, on the emitting thread."""

    def __init__(self, callback: Callable[[TrajectoryEvent], object]) -> None:
        if not callable(callback):
            raise TypeError("CallbackSink needs a callable")
        self.callback = callback

    def emit(self, event: TrajectoryEvent) -> None:
        """Pass the event to the callback."""
        self.callback(event)


_open_sinks: weakref.WeakSet[JsonlSink] = weakref.WeakSet()


@atexit.register
def _close_open_sinks() -> None:  # pragma: no cover - runs at interpreter exit
    for sink in list(_open_sinks):
        sink.close(timeout_s=2.0)


class JsonlSink:
    """Appends one camelCase JSON event per line to ``path``, off the caller's thread.

    ``emit`` never blocks: events go into a bounded queue (``max_queue``) drained by a
    writer thread; when the queue is full the event is dropped and counted in
    ``dropped``. A path that cannot be written is reported once on the ``agentkv``
    logger and counted in ``write_errors``; the harness carries on. Call ``flush()`` to
    wait until queued events are on disk, ``close()`` when done (also done at exit).
    """

    _STOP = object()

    def __init__(self, path: str | Path, *, max_queue: int = 10_000) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be at least 1")
        self.path = Path(path)
        self.dropped = 0
        self.written = 0
        self.write_errors = 0
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max_queue)
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._closed = False

    def _ensure_thread(self) -> None:
        with self._start_lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name=f"agentkv-jsonl:{self.path.name}", daemon=True
                )
                self._thread.start()
                _open_sinks.add(self)

    def emit(self, event: TrajectoryEvent) -> None:
        """Queue the event for writing; drop and count it if the queue is full."""
        if self._closed:
            self.dropped += 1
            return
        if self._thread is None:
            self._ensure_thread()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        fh = None
        reported = False
        while True:
            item = self._queue.get()
            try:
                if item is self._STOP:
                    return
                if isinstance(item, threading.Event):
                    if fh is not None:
                        fh.flush()
                    item.set()
                    continue
                assert isinstance(item, TrajectoryEvent)
                line = json.dumps(item.to_wire(), separators=(",", ":")) + "\n"
                try:
                    if fh is None:
                        self.path.parent.mkdir(parents=True, exist_ok=True)
                        fh = self.path.open("a", encoding="utf-8")
                    fh.write(line)
                    self.written += 1
                    if self._queue.empty():
                        fh.flush()
                except OSError as exc:
                    self.write_errors += 1
                    self.dropped += 1
                    fh = None
                    if not reported:
                        reported = True
                        logger.warning(
                            "agentkv: cannot write events to %s (%s); events are dropped",
                            self.path,
                            exc,
                        )
            finally:
                if item is self._STOP and fh is not None:
                    fh.close()
                self._queue.task_done()

    def flush(self, timeout_s: float = 5.0) -> bool:
        """Wait until every queued event is written; False if it took over ``timeout_s``."""
        if self._thread is None or self._closed:
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued, stop the writer thread and close the file."""
        if self._closed:
            return
        self.flush(timeout_s)
        self._closed = True
        thread = self._thread
        if thread is not None:
            try:
                self._queue.put(self._STOP, timeout=timeout_s)
            except queue.Full:
                return
            thread.join(timeout_s)
        _open_sinks.discard(self)
