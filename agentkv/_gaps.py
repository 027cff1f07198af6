"""Gap learning: per-tool-class quantiles of how long the KV cache sits idle.

The policy decides retain / offload / release from how long a trajectory's KV will sit
unused, so :class:`GapModel` learns the whole distribution per tool class, not a mean:
a 20 ms fast path and a 20 s slow path must not average into one mediocre tool.

Two gaps, two *kinds*:

- ``"idle"`` (the default): model call finished -> next model call of the same
  trajectory started. This is what the cache pays for.
- ``"tool"``: tool started -> tool finished.

Per ``(kind, level)`` the model keeps a streaming quantile sketch
(:class:`~agentkv._sketch.TDigestSketch`), an EWMA
(``ewma = alpha * observed + (1 - alpha) * previous``), a count and the last update.

**Fallback.** Tool classes nest with ``:``. A sample of ``shell:pytest`` is learned at
``shell:pytest``, at ``shell`` and at ``*`` (all tools). A query walks the same chain
and answers from the first level holding at least ``min_samples`` samples, then from a
fixed prior. :attr:`GapEstimate.source` names the level that answered.

**Drift.** Recent samples weigh more, by age measured in time: a sample observed at
time ``t`` weighs ``2 ** ((t - landmark) / half_life_s)`` (forward decay). Ratios of
weights depend only on the age difference, so a sample one half-life older counts half
as much, queries need no "now", and samples of the same age weigh the same: the
estimates are then the plain quantiles of those samples, within the sketch's error.
The landmark moves forward now and then so that weights stay in range.

**Persistence** is opt-in (``GapModel(store=True)``); see :mod:`agentkv._gapstore`.
Samples are batched and flushed as a delta that the store merges with what other
processes learned; after a flush the model answers from the merged state.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal, NamedTuple

from agentkv._errors import AgentKVError, ConfigError
from agentkv._guard import is_strict, warn_once
from agentkv._sketch import (
    DEFAULT_MAX_CENTROIDS,
    MAX_EXPONENT,
    ForwardDecay,
    GapPrior,
    TDigestSketch,
)

if TYPE_CHECKING:
    from agentkv._gapstore import GapRecord, GapStore
    from agentkv._models import TrajectoryEvent

__all__ = ["ALL_TOOLS", "GAP_KINDS", "GapEstimate", "GapKind", "GapModel", "GapPrior"]

logger = logging.getLogger("agentkv")

GapKind = Literal["idle", "tool"]
GAP_KINDS: tuple[str, ...] = ("idle", "tool")
ALL_TOOLS = "*"
"""The level that pools every tool class of a kind."""

_INF = math.inf
_MAX_PENDING = 100_000
_REFRESH_FRACTION = 0.005  # estimate() recomputes quantiles after this much new weight
_EPOCH_MS_FLOOR = 1_000_000_000_000  # emitted_at_ms below this is not a wall-clock time


class GapEstimate(NamedTuple):
    """What the gap model expects of one tool class's gap, in seconds (immutable).

    ``source`` is the level that answered after fallback: the class itself, a parent
    class, ``"*"`` (all tools) or ``"prior"``. ``n`` is that level's sample count.
    ``confident`` is true when the class itself or a parent class (not the all-tools
    pool, not the prior) held at least ``min_samples`` samples.
    ``updated_at_s`` is the newest sample's wall-clock time (``None`` for the prior).

    A named tuple, so that building one on the hot path costs a fraction of a
    microsecond; read it by field name (``est.p90``), ``est._asdict()`` for a dict.
    """

    p50: float
    p90: float
    p99: float
    ewma: float
    n: int
    confident: bool
    source: str
    kind: str = "idle"
    updated_at_s: float | None = None


class _Entry:
    """One level of one kind: sketch, count, EWMA, last update, cached quantiles.

    ``quantiles`` (p50, p90, p99) are reused by :meth:`GapModel.estimate` until the
    weight added since they were computed (``w_new``) exceeds ``_REFRESH_FRACTION`` of
    the total (``w_total``): at most 0.5% stale in rank, and a class under ~200 samples
    is recomputed on every new sample.
    """

    __slots__ = ("ewma", "level", "n", "quantiles", "sketch", "updated_at_s", "w_new", "w_total")

    def __init__(self, level: str, sketch: TDigestSketch) -> None:
        self.level = level
        self.sketch = sketch
        self.n = 0
        self.ewma = 0.0
        self.updated_at_s = -_INF
        self.quantiles: tuple[float, float, float] | None = None
        self.w_new = 0.0
        self.w_total = sketch.total_weight

    def reset_weights(self) -> None:
        """Forget the cached quantiles after the sketch's weights were rescaled."""
        self.quantiles = None
        self.w_new = 0.0
        self.w_total = self.sketch.total_weight


def _levels(tool_class: str) -> tuple[str, ...]:
    """``"a:b:c"`` -> ``("a:b:c", "a:b", "a", "*")``."""
    if tool_class == ALL_TOOLS:
        return (ALL_TOOLS,)
    out = [tool_class]
    name = tool_class
    while (cut := name.rfind(":")) > 0:
        name = name[:cut]
        out.append(name)
    out.append(ALL_TOOLS)
    return tuple(out)


class GapModel:
    """Per-tool-class gap quantiles, learned online, optionally persisted.

    ``GapModel()`` lives in memory and needs no files. ``GapModel(store=True)`` also
    persists to the local gap store (``store`` may be a path or a
    :class:`~agentkv._gapstore.GapStore`), in ``namespace``, flushing every
    ``flush_every`` samples or ``flush_interval_s`` seconds, on :meth:`flush`,
    :meth:`close` and at interpreter exit. Store problems are logged on logger
    ``agentkv`` and never raised: learning goes on in memory.

    Times (``at``) are wall-clock seconds since the epoch (the default is now), because
    a persisted model is shared by processes. Thread-safe.

    >>> m = GapModel(min_samples=2)
    >>> for gap_s in (0.1, 0.2, 0.3):
    ...     m.observe("shell:pytest", gap_s)
    >>> m.estimate("shell:pytest").source, m.estimate("shell:git").source
    ('shell:pytest', 'shell')
    """

    def __init__(
        self,
        *,
        half_life_s: float | None = 86_400.0,
        ewma_alpha: float = 0.2,
        min_samples: int = 20,
        prior: GapPrior | None = None,
        store: GapStore | str | os.PathLike[str] | bool | None = None,
        namespace: str = "default",
        flush_every: int = 256,
        flush_interval_s: float = 10.0,
        max_classes: int = 1024,
        max_centroids: int = DEFAULT_MAX_CENTROIDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if half_life_s is not None and not 0.0 < half_life_s < _INF:
            raise ConfigError(
                f"half_life_s must be positive (or None: no decay), got {half_life_s}"
            )
        if not 0.0 < ewma_alpha <= 1.0:
            raise ConfigError(f"ewma_alpha must be in (0, 1], got {ewma_alpha}")
        if min_samples < 1 or flush_every < 1 or max_classes < 1:
            raise ConfigError("min_samples, flush_every and max_classes must be at least 1")
        if not namespace or len(namespace) > 256:
            raise ConfigError("namespace must be a non-empty string of at most 256 characters")
        self._decay = ForwardDecay(half_life_s)
        self._half_life_s = half_life_s
        self._inv_hl = self._decay.inv_half_life
        self._landmark_s: float | None = None
        self._alpha = ewma_alpha
        self._min_samples = min_samples
        self._prior = prior or GapPrior()
        self._max_classes = max_classes
        self._max_centroids = max_centroids
        self._clock = clock
        self._lock = threading.RLock()
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._chains: dict[tuple[str, str], tuple[_Entry, ...]] = {}
        self._num_classes = dict.fromkeys(GAP_KINDS, 0)
        # persistence
        self.namespace = namespace
        self._flush_every = flush_every
        self._flush_interval_s = flush_interval_s
        self._pending: list[tuple[str, str, float, float]] = []
        self._last_flush_mono = time.monotonic()
        self._flush_lock = threading.Lock()
        self._store: GapStore | None = None
        if store is not None and store is not False:
            from agentkv._gapstore import flush_at_exit, open_store_quietly

            self._store = open_store_quietly(store, strict=is_strict())
            if self._store is not None:
                self._pull()
                atexit.register(flush_at_exit, weakref.ref(self))

    # --- learning -------------------------------------------------------------------
    def observe(
        self, tool_class: str, gap_s: float, *, at: float | None = None, kind: str = "idle"
    ) -> None:
        """Learn one gap of ``gap_s`` seconds for ``tool_class`` (observed at ``at``).

        A negative, NaN or infinite gap is dropped with a warning (raised under
        ``AGENTKV_STRICT=1``). An unknown ``kind`` or an empty class is a ``ValueError``.
        """
        if not 0.0 <= gap_s < _INF:
            self._reject(f"gap_s must be a finite number >= 0, got {gap_s!r}")
            return
        t = self._clock() if at is None else at
        flush = False
        with self._lock:
            chain = self._chains.get((kind, tool_class)) or self._make_chain(kind, tool_class)
            w = self._weight(t)
            alpha = self._alpha
            for e in chain:
                e.sketch.add(gap_s, w)
                e.n += 1
                e.ewma = gap_s if e.n == 1 else e.ewma + alpha * (gap_s - e.ewma)
                if t > e.updated_at_s:
                    e.updated_at_s = t
                e.w_new += w
                e.w_total += w
            if self._store is not None:
                self._pending.append((kind, tool_class, gap_s, t))
                flush = len(self._pending) >= self._flush_every or (
                    time.monotonic() - self._last_flush_mono >= self._flush_interval_s
                )
        if flush:
            self.flush()

    def emit(self, event: TrajectoryEvent) -> None:
        """Learn from a lifecycle event (usable as an event sink; never raises).

        ``tool_finished`` with ``duration_ms`` and ``tool_class`` teaches the ``"tool"``
        kind (cancelled tools are skipped: their duration is not the tool's);
        ``model_started`` with ``idle_gap_ms`` teaches the ``"idle"`` kind under
        ``after_tool_class`` (the all-tools pool when no tool ran). ``emitted_at_ms`` is
        used as the time when it is a wall-clock time, else now.
        """
        try:
            ms = event.emitted_at_ms
            at = ms / 1000.0 if ms >= _EPOCH_MS_FLOOR else None
            if event.event == "tool_finished":
                if (
                    event.duration_ms is not None
                    and event.tool_class is not None
                    and event.status != "cancelled"
                ):
                    self.observe(event.tool_class, event.duration_ms / 1000.0, at=at, kind="tool")
            elif event.event == "model_started" and event.idle_gap_ms is not None:
                cls = event.after_tool_class or ALL_TOOLS
                self.observe(cls, event.idle_gap_ms / 1000.0, at=at, kind="idle")
        except Exception:
            if is_strict():
                raise
            logger.warning("agentkv gap model could not learn from an event", exc_info=True)

    def _reject(self, msg: str) -> None:
        if is_strict():
            raise AgentKVError(msg)
        warn_once("gaps:reject:" + msg.split(",")[0], "agentkv gap model dropped a sample: %s", msg)

    def _make_chain(self, kind: str, tool_class: str) -> tuple[_Entry, ...]:
        if kind not in GAP_KINDS:
            raise ValueError(f"kind must be one of {GAP_KINDS}, got {kind!r}")
        if not isinstance(tool_class, str) or not tool_class or len(tool_class) > 256:
            raise ValueError("tool_class must be a non-empty string of at most 256 characters")
        chain = []
        for level in _levels(tool_class):
            e = self._entries.get((kind, level))
            if e is None:
                if level != ALL_TOOLS and self._num_classes[kind] >= self._max_classes:
                    warn_once(
                        "gaps:max_classes",
                        "agentkv gap model holds %d tool classes; new classes such as %r are "
                        "learned under their parent class only (raise max_classes?)",
                        self._max_classes,
                        tool_class,
                    )
                    continue
                e = self._new_entry(kind, level)
            chain.append(e)
        out = tuple(chain)
        self._chains[(kind, tool_class)] = out
        return out

    def _levels_of(self, kind: str, tool_class: str) -> tuple[str, ...]:
        chain = self._chains.get((kind, tool_class))
        return tuple(e.level for e in chain) if chain else _levels(tool_class)

    def _new_entry(self, kind: str, level: str) -> _Entry:
        e = _Entry(level, TDigestSketch(self._max_centroids))
        self._entries[(kind, level)] = e
        if level != ALL_TOOLS:
            self._num_classes[kind] += 1
        return e

    # --- decay ------------------------------------------------------------------------
    def _weight(self, t: float) -> float:
        if self._half_life_s is None:
            return 1.0
        if self._landmark_s is None:
            self._landmark_s = self._decay.fresh_landmark(t)
        x = (t - self._landmark_s) * self._inv_hl
        if x > MAX_EXPONENT:
            self._rebase(self._decay.fresh_landmark(t))
            x = (t - self._landmark_s) * self._inv_hl
        elif x < 0.0:
            x = 0.0  # older than the landmark: as old as the oldest weight we keep
        return float(2.0**x)

    def _rebase(self, landmark_s: float) -> None:
        """Move the landmark to ``landmark_s``, rescaling every sketch to match."""
        if self._landmark_s is not None:
            factor = self._decay.factor(self._landmark_s, landmark_s)
            for e in self._entries.values():
                e.sketch.scale(factor)
                e.reset_weights()
        self._landmark_s = landmark_s

    # --- queries ----------------------------------------------------------------------
    def estimate(
        self, tool_class: str, *, kind: str = "idle", fallback: bool = True
    ) -> GapEstimate:
        """Return p50 / p90 / p99 / EWMA / n of ``tool_class``'s gap, in seconds.

        With ``fallback`` (the default) a class with fewer than ``min_samples`` samples
        is answered by its parent class, then all tools, then the prior. Without it the
        class's own figures come back (``confident`` false while it is small; the prior
        when it has no samples). ``n``, ``ewma`` and ``updated_at_s`` are always current;
        p50/p90/p99 are recomputed once the weight learned since the last computation
        exceeds 0.5% of the class's total (at most 0.5% stale in rank, exact for small
        classes); :meth:`quantile` is never stale.
        """
        with self._lock:
            if not fallback:
                e = self._entries.get((kind, tool_class))
                if e is None or e.n == 0:
                    return self._prior_estimate(kind)
                return self._compute(e, kind)
            for level in _levels(tool_class):
                e = self._entries.get((kind, level))
                if e is not None and e.n >= self._min_samples:
                    return self._compute(e, kind)
            return self._prior_estimate(kind)

    def quantile(self, tool_class: str, q: float, *, kind: str = "idle") -> float:
        """Return the ``q`` quantile (0..1) of ``tool_class``'s gap in seconds, with fallback."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        with self._lock:
            for level in _levels(tool_class):
                e = self._entries.get((kind, level))
                if e is not None and e.n >= self._min_samples:
                    return e.sketch.quantile(q)
            return self._prior.quantile(q)

    def _prior_estimate(self, kind: str) -> GapEstimate:
        p = self._prior
        return GapEstimate(p.p50_s, p.p90_s, p.p99_s, p.mean_s, 0, False, "prior", kind)

    def _compute(self, e: _Entry, kind: str) -> GapEstimate:
        qs = e.quantiles
        if qs is None or e.w_new > e.w_total * _REFRESH_FRACTION:
            q = e.sketch.quantile
            qs = e.quantiles = (q(0.5), q(0.9), q(0.99))
            e.w_new = 0.0
        return GapEstimate(
            qs[0],
            qs[1],
            qs[2],
            e.ewma,
            e.n,
            e.n >= self._min_samples and e.level != ALL_TOOLS,
            e.level,
            kind,
            e.updated_at_s,
        )

    def tool_classes(self, kind: str = "idle") -> list[str]:
        """Return the learned levels of ``kind`` (classes, parent classes and ``"*"``), sorted."""
        with self._lock:
            return sorted(lv for (k, lv), e in self._entries.items() if k == kind and e.n > 0)

    @property
    def half_life_s(self) -> float | None:
        """The decay half-life in seconds (``None``: no decay)."""
        return self._half_life_s

    @property
    def min_samples(self) -> int:
        """Samples a level needs before it answers instead of falling back."""
        return self._min_samples

    @property
    def store(self) -> GapStore | None:
        """The attached store, or ``None`` when the model is memory-only."""
        return self._store

    # --- persistence ------------------------------------------------------------------
    def flush(self) -> bool:
        """Send the samples learned since the last flush to the store and reload.

        Returns ``True`` when the store holds them (also when there was nothing to
        send), ``False`` when the store was busy or failed: the samples stay pending and
        go with the next flush. Never raises for store trouble.
        """
        if self._store is None:
            return True
        from agentkv._gapstore import push_samples

        with self._flush_lock:
            with self._lock:
                batch = self._pending
                self._pending = []
                self._last_flush_mono = time.monotonic()
            if not batch:
                return True
            try:
                records = push_samples(
                    self._store,
                    self.namespace,
                    [(k, self._levels_of(k, c), g, t) for k, c, g, t in batch],
                    decay=self._decay,
                    ewma_alpha=self._alpha,
                    max_centroids=self._max_centroids,
                )
            except Exception as exc:
                with self._lock:
                    self._pending[:0] = batch
                    if len(self._pending) > _MAX_PENDING:
                        del self._pending[: len(self._pending) - _MAX_PENDING]
                        warn_once("gaps:pending", "agentkv gap model dropped its oldest samples")
                self._store_failed(exc)
                return False
            with self._lock:
                self._install(records)
            return True

    def _pull(self) -> None:
        assert self._store is not None
        try:
            records = self._store.read(self.namespace)
        except Exception as exc:
            self._store_failed(exc)
            return
        with self._lock:
            self._install(records)

    def _store_failed(self, exc: Exception) -> None:
        import sqlite3

        if is_strict() and not isinstance(exc, sqlite3.OperationalError):
            raise exc
        if isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError):
            assert self._store is not None
            try:
                self._store.reset()
                return
            except Exception:
                logger.warning("agentkv gap store could not be reset", exc_info=True)
        warn_once(
            f"gaps:store:{type(exc).__name__}",
            "agentkv gap store %s: %s; samples stay in memory and are retried at the next flush",
            getattr(self._store, "path", "?"),
            exc,
        )

    def _install(self, records: list[GapRecord]) -> None:
        """Replace the in-memory state by ``records``, then replay pending samples."""
        from agentkv._gapstore import load_records

        load_records(self, records)
        pending = self._pending
        self._pending = []
        store, self._store = self._store, None  # replay without re-queueing
        try:
            for kind, tool_class, gap_s, t in pending:
                self.observe(tool_class, gap_s, at=t, kind=kind)
        finally:
            self._store = store
            self._pending[:0] = pending

    def close(self) -> None:
        """Flush and close the store (idempotent). The model stays usable in memory."""
        if self._store is not None:
            self.flush()
            self._store.close()
            self._store = None

    def __enter__(self) -> GapModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        where = f", store={self._store!r}, namespace={self.namespace!r}" if self._store else ""
        return f"GapModel(classes={sum(self._num_classes.values())}{where})"
