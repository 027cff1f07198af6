"""The link between a gap model and its store: pending samples, flush timing, failures.

:class:`StoreSync` collects the samples a :class:`~agentkv.GapModel` learned since its
last flush, sends them to the :class:`~agentkv.gaps._store.GapStore` as a delta (merged
with what other processes learned, in one transaction) and hands back the merged
records for the model to load. It deals only in samples and records: the model's
in-memory state stays the model's.

Invariants:

- **A sample is never lost to a failed flush.** A batch the store did not take goes
  back to the head of the pending list (bounded: beyond ``max_pending`` the oldest are
  dropped, with one warning) and goes with the next flush.
- **Store trouble is never raised** (outside strict mode): a busy store is retried at
  the next flush; a store found corrupt while in use is moved aside and started afresh.
- **A flush never runs on the caller's path** when learning triggers it
  (:meth:`StoreSync.flush_in_background`): one worker thread at a time runs it; a
  request that arrives while it runs makes it run once more, and so does a batch's worth
  of samples learned meanwhile (learning asks for no flush while one runs).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable

from agentkv._clock import Clock, SystemClock
from agentkv._guard import is_strict, warn_once
from agentkv.gaps._sketch import ForwardDecay
from agentkv.gaps._store import GapRecord, GapStore, push_samples

__all__ = ["Sample", "StoreSync"]

logger = logging.getLogger("agentkv")

#: One learned sample: ``(kind, tool_class, gap_s, at_s)``.
Sample = tuple[str, str, float, float]


class StoreSync:
    """Pending samples of one gap model and the store they are flushed to. Thread-safe.

    ``queue`` is called by the model for every sample it learns; ``push`` sends the
    pending batch (callers hold :attr:`flush_lock` around ``push`` and loading the
    records it returns, so that two flushes load in the order they pushed).
    """

    def __init__(
        self,
        store: GapStore,
        namespace: str,
        *,
        flush_every: int,
        flush_interval_s: float,
        decay: ForwardDecay,
        ewma_alpha: float,
        max_centroids: int,
        clock: Clock,
        max_pending: int = 100_000,
    ) -> None:
        self.store = store
        self.namespace = namespace
        self.flush_every = flush_every
        self.flush_interval_s = flush_interval_s
        self.max_pending = max_pending
        self.flush_lock = threading.Lock()
        self._decay = decay
        self._alpha = ewma_alpha
        self._max_centroids = max_centroids
        self._clock = clock
        # Read on every sample: the system clock's function itself, without its method.
        self._monotonic = time.monotonic if type(clock) is SystemClock else clock.monotonic
        self._lock = threading.Lock()
        self._pending: list[Sample] = []
        self._last_flush_s = clock.monotonic()
        self._worker: threading.Thread | None = None
        self._again = False

    def queue(self, sample: Sample) -> bool:
        """Add a learned sample; True when a flush is due (by count or by time) and none
        runs now (a running one looks again when it is done: :meth:`_work`)."""
        with self._lock:
            self._pending.append(sample)
            if self._worker is not None:
                return False
            return len(self._pending) >= self.flush_every or (
                self._monotonic() - self._last_flush_s >= self.flush_interval_s
            )

    def flush_in_background(self, flush: Callable[[], object]) -> None:
        """Run ``flush`` on a worker thread; never waits for it (see the invariants)."""
        with self._lock:
            if self._worker is not None:
                self._again = True
                return
            self._last_flush_s = self._clock.monotonic()  # not due again meanwhile
            self._worker = threading.Thread(
                target=self._work, args=(flush,), name="agentkv-gap-flush", daemon=True
            )
            worker = self._worker
        worker.start()

    def _work(self, flush: Callable[[], object]) -> None:
        while True:
            ok: object = False
            try:
                ok = flush()
            except Exception:
                if is_strict():
                    raise
                logger.warning("agentkv gap model: background flush failed", exc_info=True)
            with self._lock:
                # Again when asked, or when a batch's worth came in meanwhile (learning
                # does not ask while a flush runs); not straight after a failure.
                if not self._again and (ok is False or len(self._pending) < self.flush_every):
                    self._worker = None
                    return
                self._again = False

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until no background flush runs; False if one still ran after ``timeout_s``."""
        with self._lock:
            worker = self._worker
        if worker is None or worker is threading.current_thread():
            return True
        worker.join(timeout_s)
        return not worker.is_alive()

    def pending(self) -> list[Sample]:
        """The samples not yet in the store, oldest first (a copy)."""
        with self._lock:
            return list(self._pending)

    def read(self) -> list[GapRecord] | None:
        """Every record of the namespace, or None when the store failed (logged)."""
        try:
            return self.store.read(self.namespace)
        except Exception as exc:
            self._failed(exc)
            return None

    def push(
        self, levels_of: Callable[[str, str], tuple[str, ...]]
    ) -> tuple[bool, list[GapRecord] | None]:
        """Send the pending samples, each to every level ``levels_of(kind, class)`` names.

        Returns ``(True, records after the merge)``; ``(True, None)`` when there was
        nothing to send; ``(False, None)`` when the store failed: the batch is pending
        again, ahead of newer samples.
        """
        with self._lock:
            batch, self._pending = self._pending, []
            self._last_flush_s = self._clock.monotonic()
        if not batch:
            return True, None
        levels: dict[tuple[str, str], tuple[str, ...]] = {}  # asked once per class
        for k, c, _, _ in batch:
            if (k, c) not in levels:
                levels[k, c] = levels_of(k, c)
        try:
            records = push_samples(
                self.store,
                self.namespace,
                [(k, levels[k, c], g, t) for k, c, g, t in batch],
                decay=self._decay,
                ewma_alpha=self._alpha,
                max_centroids=self._max_centroids,
            )
        except Exception as exc:
            with self._lock:
                self._pending[:0] = batch
                if len(self._pending) > self.max_pending:
                    del self._pending[: len(self._pending) - self.max_pending]
                    warn_once("gaps:pending", "agentkv gap model dropped its oldest samples")
            self._failed(exc)
            return False, None
        return True, records

    def close(self) -> None:
        """Close the store (the caller flushes first)."""
        self.store.close()

    def _failed(self, exc: Exception) -> None:
        if is_strict() and not isinstance(exc, sqlite3.OperationalError):
            raise exc
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
            try:
                self.store.reset()
                return
            except Exception:
                logger.warning("agentkv gap store could not be reset", exc_info=True)
        warn_once(
            f"gaps:store:{type(exc).__name__}",
            "agentkv gap store %s: %s; samples stay in memory and are retried at the next flush",
            getattr(self.store, "path", "?"),
            exc,
        )
