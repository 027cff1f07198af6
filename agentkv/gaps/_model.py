"""Gap learning: per-tool-class quantiles of how long the KV cache sits idle.

The policy decides retain / offload / release from how long a trajectory's KV will sit
unused, so :class:`GapModel` learns the whole distribution per tool class, not a mean:
a 20 ms fast path and a 20 s slow path must not average into one mediocre tool.

Three *kinds* of gap:

- ``"idle"`` (the default): model call finished -> next model call of the same
  trajectory started, keyed by the tool that ran in between. This is what the cache
  pays for.
- ``"tool"``: tool started -> tool finished.
- ``"next"``: the same idle gap, keyed by the tool that ran *before* the call the gap
  follows. A call is sent before its answer chooses the next tool, so what the call can
  carry is this forecast: the gap that follows a call sent after ``execute_bash`` mixes
  every tool such calls go on to run, as often as they do
  (:meth:`GapModel.estimate_after_call`). It is learned from ``model_started`` events,
  which name the trajectory: the model remembers what each trajectory's last call
  followed (at most :data:`MAX_TRACKED_TRAJECTORIES`, least recently seen forgotten).

Per ``(kind, level)`` the model keeps a streaming quantile sketch
(:class:`~agentkv.gaps._sketch.TDigestSketch`), an EWMA
(``ewma = alpha * observed + (1 - alpha) * previous``), a count and the last update, in
its level table (:mod:`agentkv.gaps._levels`).

**Fallback.** Tool classes nest with ``:``. A sample of ``shell:pytest`` is learned at
``shell:pytest``, at ``shell`` and at ``*`` (all tools). A query walks the same chain
and answers from the first level holding at least ``min_samples`` samples, then from a
fixed prior. With ``priors`` (per tool family, :mod:`agentkv.gaps._priors`) an idle-gap
query for a class whose family has a prior gets that prior before the all-tools pool
(``source`` ``"prior:<family>"``). :attr:`GapEstimate.source` names what answered.

**Drift.** Recent samples weigh more, by age measured in time: a sample observed at
time ``t`` weighs ``2 ** ((t - landmark) / half_life_s)`` (forward decay). Ratios of
weights depend only on the age difference, so a sample one half-life older counts half
as much, queries need no "now", and samples of the same age weigh the same: the
estimates are then the plain quantiles of those samples, within the sketch's error.
The landmark moves forward now and then so that weights stay in range.

**Persistence** is opt-in (``GapModel(store=True)``); see :mod:`agentkv.gaps._store`.
Samples are batched and flushed as a delta that the store merges with what other
processes learned (:mod:`agentkv.gaps._sync`); after a flush the model answers from the
merged state. The store deals only in records: :meth:`GapModel.export_records` and
:meth:`GapModel.import_records` are the model's side of that exchange.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from agentkv._clock import Clock, as_clock
from agentkv._errors import AgentKVError, ConfigError
from agentkv._guard import is_strict, warn_once
from agentkv.gaps._levels import ALL_TOOLS, GAP_KINDS, Level, LevelTable, chain_of
from agentkv.gaps._sketch import (
    DEFAULT_MAX_CENTROIDS,
    ForwardDecay,
    GapPrior,
)

if TYPE_CHECKING:
    from agentkv.events._schema import TrajectoryEvent
    from agentkv.gaps._priors import ClassPriors
    from agentkv.gaps._store import GapRecord, GapStore
    from agentkv.gaps._sync import StoreSync

__all__ = [
    "ALL_TOOLS",
    "FLUSH_BUSY_TIMEOUT_S",
    "GAP_KINDS",
    "GapEstimate",
    "GapKind",
    "GapModel",
    "GapPrior",
]

logger = logging.getLogger("agentkv")

GapKind = Literal["idle", "tool", "next"]

_INF = math.inf
_MAX_PENDING = 100_000
#: Trajectories whose last call's preceding tool the model remembers (for the ``next`` kind).
MAX_TRACKED_TRAJECTORIES = 4096
_REFRESH_FRACTION = 0.005  # estimate() recomputes quantiles after this much new weight
_EPOCH_MS_FLOOR = 1_000_000_000_000  # emitted_at_ms below this is not a wall-clock time


def _event_time_s(emitted_at_ms: int) -> float | None:
    """An event's ``emitted_at_ms`` in seconds where it is a wall-clock time (else None:
    the model's clock says when)."""
    return emitted_at_ms / 1000.0 if emitted_at_ms >= _EPOCH_MS_FLOOR else None

#: How long a flush waits for another process's write lock before giving up until the
#: next flush (flushes run in the background, but must not hold a thread for long).
FLUSH_BUSY_TIMEOUT_S = 0.5
_CLOSE_ATTEMPTS = 4
_OPEN_WAIT_AT_CLOSE_S = 30.0  # close() waits this long for a store still opening (a loaded machine)


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


_tuple_new: Callable[[type[GapEstimate], tuple[Any, ...]], GapEstimate] = tuple.__new__


class GapModel:
    """Per-tool-class gap quantiles, learned online, optionally persisted.

    ``GapModel()`` lives in memory and needs no files. ``GapModel(store=True)`` also
    persists to the local gap store (``store`` may be a path or a
    :class:`~agentkv.gaps._store.GapStore`), in ``namespace``, flushing every
    ``flush_every`` samples or ``flush_interval_s`` seconds (on a background thread,
    never on the path of the call that learned the sample), on :meth:`flush`,
    :meth:`close` and at interpreter exit. A store another process keeps locked is
    waited for at most :data:`FLUSH_BUSY_TIMEOUT_S` and retried at the next flush.
    Store problems are logged on logger ``agentkv`` and never raised: learning goes on
    in memory. With ``open_in_background=True`` the store is opened and read on a
    thread of its own (the process's learner does this, so no model call waits for the
    store): until it is attached the model answers from what it learned and its priors,
    and the samples of that time go to the store with the first flush
    (:meth:`wait_open` waits for it).

    ``prior`` answers when nothing was learned; ``priors`` (per tool family, for
    example :func:`agentkv.gaps._priors.default_priors`, which the process's learner
    uses) answer first for classes of a known family.

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
        priors: ClassPriors | None = None,
        store: GapStore | str | os.PathLike[str] | bool | None = None,
        namespace: str = "default",
        flush_every: int = 256,
        flush_interval_s: float = 10.0,
        max_classes: int = 1024,
        max_centroids: int = DEFAULT_MAX_CENTROIDS,
        clock: Clock | Callable[[], float] | None = None,
        open_in_background: bool = False,
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
        self._alpha = ewma_alpha
        self._min_samples = min_samples
        self._prior = prior or GapPrior()
        self._priors = priors
        self._clock = as_clock(clock)
        self._lock = threading.RLock()
        self._table = LevelTable(self._decay, max_classes=max_classes, max_centroids=max_centroids)
        # trajectory id -> the tool class its last model call followed (None: no tool)
        self._call_after: OrderedDict[str, str | None] = OrderedDict()
        # persistence
        self.namespace = namespace
        self._sync: StoreSync | None = None
        # samples learned while the store opens in the background (None: not opening)
        self._early: list[tuple[str, str, float, float]] | None = None
        self._opener: threading.Thread | None = None
        if store is not None and store is not False:
            settings = (store, flush_every, flush_interval_s, max_centroids)
            if open_in_background:
                self._early = []
                self._opener = threading.Thread(
                    target=self._attach, args=settings, name="agentkv-gap-store", daemon=True
                )
                self._opener.start()
            else:
                self._attach(*settings)

    def _attach(
        self,
        store: GapStore | str | os.PathLike[str] | bool,
        flush_every: int,
        flush_interval_s: float,
        max_centroids: int,
    ) -> None:
        """Open the store, hand it what was learned meanwhile, and load what it holds."""
        from agentkv.gaps._store import open_store_quietly
        from agentkv.gaps._sync import StoreSync

        try:
            opened = open_store_quietly(
                store,
                strict=is_strict() and self._opener is None,
                busy_timeout_s=FLUSH_BUSY_TIMEOUT_S,
            )
        except Exception:
            if self._opener is None:
                raise
            logger.warning("agentkv gap store could not be opened", exc_info=True)
            opened = None
        if opened is None:
            with self._lock:
                self._early = None
            return
        sync = StoreSync(
            opened,
            self.namespace,
            flush_every=flush_every,
            flush_interval_s=flush_interval_s,
            decay=self._decay,
            ewma_alpha=self._alpha,
            max_centroids=max_centroids,
            clock=self._clock,
            max_pending=_MAX_PENDING,
        )
        records = sync.read()
        with self._lock:
            for sample in self._early or ():
                sync.queue(sample)
            self._early = None
            self._sync = sync
            if records is not None:
                self._install(records)
        atexit.register(_flush_at_exit, weakref.ref(self))

    def wait_open(self, timeout_s: float | None = None) -> bool:
        """Wait until a store opening in the background is attached (or failed); False
        if it still opens after ``timeout_s``. True at once for a model opened in place."""
        opener = self._opener
        if opener is not None:
            opener.join(timeout_s)
            return not opener.is_alive()
        return True

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
        t = self._clock.time() if at is None else at
        flush = False
        sync = self._sync
        with self._lock:
            self._table.learn(kind, tool_class, gap_s, t, self._alpha)
            if sync is not None:
                flush = sync.queue((kind, tool_class, gap_s, t))
            elif self._early is not None and len(self._early) < _MAX_PENDING:
                self._early.append((kind, tool_class, gap_s, t))
        if flush and sync is not None:
            sync.flush_in_background(self.flush)  # never on the caller's (model call) path

    def emit(self, event: TrajectoryEvent) -> None:
        """Learn from a lifecycle event (usable as an event sink; never raises).

        ``tool_finished`` with ``duration_ms`` and ``tool_class`` teaches the ``"tool"``
        kind (cancelled tools are skipped: their duration is not the tool's);
        ``model_started`` with ``idle_gap_ms`` teaches the ``"idle"`` kind under
        ``after_tool_class`` (the all-tools pool when no tool ran) and the ``"next"``
        kind (:meth:`learn_call`). ``emitted_at_ms`` is used as the time when it is a
        wall-clock time, else now.
        """
        try:
            ms = event.emitted_at_ms
            at = _event_time_s(ms)
            if event.event == "tool_finished":
                if (
                    event.duration_ms is not None
                    and event.tool_class is not None
                    and event.status != "cancelled"
                ):
                    self.observe(event.tool_class, event.duration_ms / 1000.0, at=at, kind="tool")
            elif event.event == "model_started":
                self.learn_call(
                    event.trajectory_id, event.after_tool_class, event.idle_gap_ms, ms
                )
        except Exception:
            if is_strict():
                raise
            logger.warning("agentkv gap model could not learn from an event", exc_info=True)

    def learn_call(
        self,
        trajectory_id: str,
        after_tool_class: str | None,
        idle_gap_ms: float | None,
        emitted_at_ms: int,
    ) -> None:
        """A model call of ``trajectory_id`` started, after ``after_tool_class`` ran
        (None: no tool) and ``idle_gap_ms`` after the trajectory's previous call ended
        (None: its first call). Never raises.

        Teaches the ``"idle"`` kind under ``after_tool_class`` (:meth:`learn_idle`) and
        the ``"next"`` kind under the tool the previous call followed (the all-tools pool
        when none did, or when this trajectory's previous call was not seen), and
        remembers ``after_tool_class`` for the trajectory's next call.
        """
        try:
            with self._lock:
                seen = self._call_after
                before = seen.pop(trajectory_id, None)
                seen[trajectory_id] = after_tool_class
                if len(seen) > MAX_TRACKED_TRAJECTORIES:
                    seen.popitem(last=False)
            if idle_gap_ms is None:
                return
            self.learn_idle(after_tool_class, idle_gap_ms, emitted_at_ms)
            at = _event_time_s(emitted_at_ms)
            self.observe(before or ALL_TOOLS, idle_gap_ms / 1000.0, at=at, kind="next")
        except Exception:
            if is_strict():
                raise
            logger.warning("agentkv gap model could not learn from a model call", exc_info=True)

    def learn_idle(
        self, after_tool_class: str | None, idle_gap_ms: float, emitted_at_ms: int
    ) -> None:
        """Learn what a ``model_started`` event carries, without the event (never raises).

        The idle gap teaches the ``"idle"`` kind under ``after_tool_class`` (the
        all-tools pool when None), at ``emitted_at_ms`` when it is a wall-clock time,
        else now: what :meth:`emit` does with such an event.
        """
        try:
            at = _event_time_s(emitted_at_ms)
            cls = after_tool_class or ALL_TOOLS
            self.observe(cls, idle_gap_ms / 1000.0, at=at, kind="idle")
        except Exception:
            if is_strict():
                raise
            logger.warning("agentkv gap model could not learn from an event", exc_info=True)

    def _reject(self, msg: str) -> None:
        if is_strict():
            raise AgentKVError(msg)
        warn_once("gaps:reject:" + msg.split(",")[0], "agentkv gap model dropped a sample: %s", msg)

    def levels(self, kind: str, tool_class: str) -> tuple[str, ...]:
        """The levels a sample of ``tool_class`` is learned at.

        The class, its parent classes and ``"*"``; fewer once ``max_classes`` is reached.
        """
        with self._lock:
            return self._table.levels_of(kind, tool_class)

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
            e = self._table.answers.get((kind, tool_class)) if fallback else None
            if e is not None:  # the class's own level answers (set below)
                return self._compute(e, kind)
            if not fallback:
                e = self._table.get(kind, tool_class)
                if e is None or e.n == 0:
                    return self._prior_estimate(kind)
                return self._compute(e, kind)
            for level in chain_of(tool_class):
                if level == ALL_TOOLS and (found := self._class_prior(tool_class, kind)):
                    return self._prior_estimate(kind, *found)
                e = self._table.get(kind, level)
                if e is not None and e.n >= self._min_samples:
                    if level == tool_class:  # first in the chain: it answers from now on
                        self._table.answers[(kind, tool_class)] = e
                    return self._compute(e, kind)
            return self._prior_estimate(kind)

    def estimate_after_call(self, tool_class: str | None) -> GapEstimate:
        """The gap that follows a model call sent after ``tool_class`` ran (None or
        ``"*"``: after no tool, or not known), as the call itself can forecast it.

        The ``"next"`` kind's figures for the class (or a parent class) where one holds
        ``min_samples`` samples; else what :meth:`estimate` answers for ``tool_class``'s
        own idle gap, as before this kind was learned (a store written without it, a
        class just seen).
        """
        cls = tool_class or ALL_TOOLS
        with self._lock:
            for level in chain_of(cls):
                if level == ALL_TOOLS:
                    break
                e = self._table.get("next", level)
                if e is not None and e.n >= self._min_samples:
                    return self._compute(e, "next")
        return self.estimate(cls, kind="idle")

    def _class_prior(self, tool_class: str, kind: str) -> tuple[GapPrior, str] | None:
        """The family prior of an idle-gap class (it answers before the all-tools pool)."""
        if self._priors is None or tool_class == ALL_TOOLS or kind != "idle":
            return None
        found = self._priors.for_class(tool_class)
        return None if found is None else (found[1], "prior:" + found[0])

    def quantile(self, tool_class: str, q: float, *, kind: str = "idle") -> float:
        """Return the ``q`` quantile (0..1) of ``tool_class``'s gap in seconds, with fallback."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must be in [0, 1], got {q!r}")
        with self._lock:
            for level in chain_of(tool_class):
                if level == ALL_TOOLS and (found := self._class_prior(tool_class, kind)):
                    return found[0].quantile(q)
                e = self._table.get(kind, level)
                if e is not None and e.n >= self._min_samples:
                    return e.sketch.quantile(q)
            return self._prior.quantile(q)

    def _prior_estimate(
        self, kind: str, prior: GapPrior | None = None, source: str = "prior"
    ) -> GapEstimate:
        p = prior or self._prior
        return GapEstimate(p.p50_s, p.p90_s, p.p99_s, p.mean_s, 0, False, source, kind)

    def _compute(self, e: Level, kind: str) -> GapEstimate:
        qs = e.quantiles
        if qs is None or e.w_new > e.w_total * _REFRESH_FRACTION:
            q = e.sketch.quantile
            qs = e.quantiles = (q(0.5), q(0.9), q(0.99))
            e.w_new = 0.0
        n = e.n
        return _tuple_new(  # GapEstimate(...) without the named tuple's Python __new__
            GapEstimate,
            (
                qs[0],
                qs[1],
                qs[2],
                e.ewma,
                n,
                n >= self._min_samples and e.level != ALL_TOOLS,
                e.level,
                kind,
                e.updated_at_s,
            ),
        )

    def tool_classes(self, kind: str = "idle") -> list[str]:
        """Return the learned levels of ``kind`` (classes, parent classes and ``"*"``), sorted."""
        with self._lock:
            return self._table.names(kind)

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
        return self._sync.store if self._sync is not None else None

    # --- persistence ------------------------------------------------------------------
    def flush(self) -> bool:
        """Send the samples learned since the last flush to the store and reload.

        Returns ``True`` when the store holds them (also when there was nothing to
        send), ``False`` when the store was busy or failed: the samples stay pending and
        go with the next flush. Never raises for store trouble.
        """
        sync = self._sync
        if sync is None:
            return True
        with sync.flush_lock:
            ok, records = sync.push(self.levels)
            if records is not None:
                self._install(records)
            return ok

    def _install(self, records: list[GapRecord]) -> None:
        """Replace the in-memory state by ``records``, then replay the pending samples."""
        assert self._sync is not None
        with self._lock:
            pending = self._sync.pending()
            table = self._table
            table.load_records(records, now_s=self._clock.time(), keep_unchanged=not pending)
            for kind, tool_class, gap_s, t in pending:
                table.learn(kind, tool_class, gap_s, t, self._alpha)

    # --- state as records ---------------------------------------------------------------
    def export_records(self) -> list[GapRecord]:
        """The learned state as records, one per learned level of each kind.

        Records carry the model's decay landmark, so :meth:`import_records` on a model
        with the same half-life gives back the same estimates (a round trip).
        """
        with self._lock:
            return self._table.export_records()

    def import_records(self, records: list[GapRecord]) -> None:
        """Replace the learned state by ``records``, all scaled to one landmark.

        ``records`` come from :meth:`export_records` or a gap store. Unknown kinds and
        empty records are skipped; a record whose sketch cannot be read is skipped with
        a warning.
        """
        with self._lock:
            self._table.load_records(records, now_s=self._clock.time(), keep_unchanged=False)

    def close(self) -> None:
        """Flush and close the store (idempotent). The model stays usable in memory.

        A busy store is tried a few more times (each try waits the store's short busy
        timeout); samples it still refused are lost with a warning.
        """
        self.wait_open(_OPEN_WAIT_AT_CLOSE_S)
        sync = self._sync
        if sync is not None:
            sync.wait_idle()
            for _ in range(_CLOSE_ATTEMPTS):
                if self.flush():
                    break
            else:
                logger.warning("agentkv gap store stayed busy; unsaved gap samples are lost")
            sync.close()
            self._sync = None

    def __enter__(self) -> GapModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        store = self.store
        where = f", store={store!r}, namespace={self.namespace!r}" if store else ""
        return f"GapModel(classes={self._table.num_classes}{where})"


def _flush_at_exit(ref: weakref.ref[GapModel]) -> None:
    """Close (flush) the model at interpreter exit, if it is still alive."""
    model = ref()
    if model is not None:
        try:
            model.close()
        except Exception:  # pragma: no cover - exit path, logged only
            logger.warning("agentkv gap model could not flush at exit", exc_info=True)
