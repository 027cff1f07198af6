"""The gap model's table: one decayed sketch per ``(kind, level)``, on one landmark.

A sample of ``shell:pytest`` is learned at every level of its chain: ``shell:pytest``,
``shell`` and ``*`` (all tools). Each level keeps a streaming quantile sketch
(:class:`~agentkv.gaps._sketch.TDigestSketch`), an EWMA
(``ewma = alpha * observed + (1 - alpha) * previous``), a count and the last update.

Invariants:

- Every sketch's weights are relative to the table's one landmark (forward decay): a
  sample at ``t`` weighs ``2 ** ((t - landmark) / half_life_s)``. When a new weight
  would leave the safe range the landmark moves forward and every sketch is rescaled
  by the same factor, which leaves quantiles unchanged.
- At most ``max_classes`` levels per kind besides ``*``: a new class beyond it is
  learned under its parent classes only (with one warning).

Not thread-safe: :class:`~agentkv.GapModel` holds its lock around every call.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from agentkv._guard import warn_once
from agentkv.gaps._sketch import MAX_EXPONENT, ForwardDecay, TDigestSketch

if TYPE_CHECKING:
    from agentkv.gaps._store import GapRecord

__all__ = ["ALL_TOOLS", "GAP_KINDS", "Level", "LevelTable", "chain_of"]

GAP_KINDS: tuple[str, ...] = ("idle", "tool", "next")
ALL_TOOLS = "*"
"""The level that pools every tool class of a kind."""

Key = tuple[str, str]  # (kind, level)


class Level:
    """One level of one kind: sketch, count, EWMA, last update, cached quantiles.

    ``quantiles`` (p50, p90, p99) are reused by :meth:`agentkv.GapModel.estimate`
    until the weight added since they were computed (``w_new``) exceeds a small share of
    the total (``w_total``); :meth:`reset_weights` forgets them after a rescale.
    """

    __slots__ = ("ewma", "level", "n", "quantiles", "sketch", "updated_at_s", "w_new", "w_total")

    def __init__(self, level: str, sketch: TDigestSketch) -> None:
        self.level = level
        self.sketch = sketch
        self.n = 0
        self.ewma = 0.0
        self.updated_at_s = -math.inf
        self.quantiles: tuple[float, float, float] | None = None
        self.w_new = 0.0
        self.w_total = sketch.total_weight

    def reset_weights(self) -> None:
        """Forget the cached quantiles after the sketch's weights were rescaled."""
        self.quantiles = None
        self.w_new = 0.0
        self.w_total = self.sketch.total_weight


def chain_of(tool_class: str) -> tuple[str, ...]:
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


class LevelTable:
    """The levels of every kind, with their chains and the shared decay landmark."""

    def __init__(self, decay: ForwardDecay, *, max_classes: int, max_centroids: int) -> None:
        self.decay = decay
        self.max_classes = max_classes
        self.max_centroids = max_centroids
        self.landmark_s: float | None = None
        self._levels: dict[Key, Level] = {}
        self._chains: dict[Key, tuple[Level, ...]] = {}
        #: ``(kind, class) -> the class's own level`` once that level answers queries
        #: (:meth:`agentkv.GapModel.estimate`); valid while the level objects stay (its
        #: count only grows), so :meth:`load_records` clears it.
        self.answers: dict[Key, Level] = {}
        self._num_classes = dict.fromkeys(GAP_KINDS, 0)

    # --- reading --------------------------------------------------------------------
    def get(self, kind: str, level: str) -> Level | None:
        """The level, or None when nothing was learned there."""
        return self._levels.get((kind, level))

    def names(self, kind: str) -> list[str]:
        """The levels of ``kind`` that hold samples, sorted."""
        return sorted(lv for (k, lv), e in self._levels.items() if k == kind and e.n > 0)

    def levels_of(self, kind: str, tool_class: str) -> tuple[str, ...]:
        """The levels a sample of ``tool_class`` is learned at."""
        chain = self._chains.get((kind, tool_class))
        return tuple(e.level for e in chain) if chain else chain_of(tool_class)

    @property
    def num_classes(self) -> int:
        """Learned levels of every kind, ``*`` excluded."""
        return sum(self._num_classes.values())

    # --- learning -------------------------------------------------------------------
    def learn(self, kind: str, tool_class: str, gap_s: float, t: float, alpha: float) -> None:
        """Fold one sample observed at ``t`` into every level of its chain."""
        chain = self._chains.get((kind, tool_class)) or self._make_chain(kind, tool_class)
        w = self._weight(t)
        for e in chain:
            e.sketch.add(gap_s, w)
            e.n += 1
            e.ewma = gap_s if e.n == 1 else e.ewma + alpha * (gap_s - e.ewma)
            if t > e.updated_at_s:
                e.updated_at_s = t
            e.w_new += w
            e.w_total += w

    def _make_chain(self, kind: str, tool_class: str) -> tuple[Level, ...]:
        if kind not in GAP_KINDS:
            raise ValueError(f"kind must be one of {GAP_KINDS}, got {kind!r}")
        if not isinstance(tool_class, str) or not tool_class or len(tool_class) > 256:
            raise ValueError("tool_class must be a non-empty string of at most 256 characters")
        chain = []
        for level in chain_of(tool_class):
            e = self._levels.get((kind, level))
            if e is None:
                if level != ALL_TOOLS and self._num_classes[kind] >= self.max_classes:
                    warn_once(
                        "gaps:max_classes",
                        "agentkv gap model holds %d tool classes; new classes such as %r are "
                        "learned under their parent class only (raise max_classes?)",
                        self.max_classes,
                        tool_class,
                    )
                    continue
                e = self._new_level(kind, level)
            chain.append(e)
        out = tuple(chain)
        self._chains[(kind, tool_class)] = out
        return out

    def _new_level(self, kind: str, level: str) -> Level:
        e = Level(level, TDigestSketch(self.max_centroids))
        self._levels[(kind, level)] = e
        if level != ALL_TOOLS:
            self._num_classes[kind] += 1
        return e

    # --- decay ------------------------------------------------------------------------
    def _weight(self, t: float) -> float:
        decay = self.decay
        if decay.half_life_s is None:
            return 1.0
        if self.landmark_s is None:
            self.landmark_s = decay.fresh_landmark(t)
        x = (t - self.landmark_s) * decay.inv_half_life
        if x > MAX_EXPONENT:
            self._rebase(decay.fresh_landmark(t))
            x = (t - self.landmark_s) * decay.inv_half_life
        elif x < 0.0:
            x = 0.0  # older than the landmark: as old as the oldest weight we keep
        return float(2.0**x)

    def _rebase(self, landmark_s: float) -> None:
        """Move the landmark to ``landmark_s``, rescaling every sketch to match."""
        if self.landmark_s is not None:
            factor = self.decay.factor(self.landmark_s, landmark_s)
            for e in self._levels.values():
                e.sketch.scale(factor)
                e.reset_weights()
        self.landmark_s = landmark_s

    # --- records ----------------------------------------------------------------------
    def export_records(self) -> list[GapRecord]:
        """One record per level that holds samples, on the table's landmark."""
        from agentkv.gaps._store import GapRecord

        landmark = self.landmark_s if self.landmark_s is not None else 0.0
        return [
            GapRecord(kind, level, e.n, e.ewma, e.updated_at_s, landmark, e.sketch.to_bytes())
            for (kind, level), e in sorted(self._levels.items())
            if e.n > 0
        ]

    def load_records(self, records: list[GapRecord], *, now_s: float, keep_unchanged: bool) -> None:
        """Replace every level by ``records``, all scaled to one landmark.

        With ``keep_unchanged``, a level whose count equals its record's holds exactly
        the stored samples (nobody else wrote to it) and is kept as it is: a single
        writer does not pay for reloading what it already has.
        """
        previous, old_landmark = self._levels, self.landmark_s
        self._levels = {}
        self._chains.clear()
        self.answers.clear()
        self._num_classes = dict.fromkeys(GAP_KINDS, 0)
        if self.decay.half_life_s is not None and records:
            latest = max(now_s, *(r.updated_at_s for r in records))
            self.landmark_s = self.decay.choose_landmark([r.landmark_s for r in records], latest)
        keep_unchanged = keep_unchanged and self.landmark_s == old_landmark
        for r in records:
            if r.kind not in GAP_KINDS or r.n <= 0:
                continue
            kept = previous.get(r.key) if keep_unchanged else None
            if kept is not None and kept.n == r.n:
                self._levels[r.key] = kept
                self._num_classes[r.kind] += r.tool_class != ALL_TOOLS
                continue
            try:
                sketch = TDigestSketch.from_bytes(r.sketch)
            except ValueError as exc:
                warn_once(
                    "gaps:row", "agentkv gap store: skipped an unreadable row %s (%s)", r.key, exc
                )
                continue
            if self.landmark_s is not None:
                sketch.scale(self.decay.factor(r.landmark_s, self.landmark_s))
            e = self._new_level(r.kind, r.tool_class)
            e.sketch = sketch
            e.n, e.ewma, e.updated_at_s = r.n, r.ewma, r.updated_at_s
            e.reset_weights()
