"""The shadow log: advice compared with when each trajectory actually came back.

The advisor logs every advice it gives (sent in ``active`` mode, only logged in
``shadow``); the client reports each trajectory's idle gap when its next model call
starts. The outcome counts tell whether the advice would have paid off before it is
switched on (see :mod:`agentkv.advice._advisor` for the rollout modes).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from typing import Any

from agentkv.events._schema import CacheAdvice

__all__ = ["ShadowLog"]


def _gap_ms(value: Any) -> float:
    """A reported gap as a finite float >= 0 (anything else counts as 0)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return max(v, 0.0) if math.isfinite(v) else 0.0


class ShadowLog:
    """Advice logged per trajectory and compared with when the trajectory came back.

    :meth:`record` keeps the latest advice of each trajectory (bounded);
    :meth:`observe_return` classifies it once the actual idle gap is known:
    ``retain_hit`` (came back within the TTL), ``retain_expired``, ``drop_ok`` (released
    or offloaded and the gap was long), ``drop_regret`` (dropped but came back within
    ``short_gap_s``), ``default``, ``prefetch``. :meth:`summary` counts outcomes and the
    median absolute error of the predicted gap. :meth:`turn` does both for one model
    call in one step and classifies in batches (``summary`` is always current).

    The pending advice is a dict in least-recently-logged order (a trajectory's entry is
    taken out before it is logged again, so it moves to the end).
    """

    _BATCH = 64  # returns classified together by :meth:`turn`

    def __init__(self, *, max_trajectories: int = 10_000, short_gap_s: float = 30.0) -> None:
        self.max_trajectories = max_trajectories
        self.short_gap_s = short_gap_s
        self._pending: dict[str, tuple[CacheAdvice, str]] = {}
        self._outcomes: Counter[str] = Counter()
        self._errors_ms: list[float] = []
        self._returns: list[tuple[CacheAdvice, str, float]] = []  # not yet classified
        self._lock = threading.Lock()

    def record(self, advice: CacheAdvice, *, mode: str) -> None:
        """Log ``advice`` (sent or not, per ``mode``) for later comparison."""
        tid = advice.trajectory_id
        with self._lock:
            self._pending.pop(tid, None)
            self._pending[tid] = (advice, mode)
            self._evict()

    def _evict(self) -> None:
        pending = self._pending
        while len(pending) > self.max_trajectories:
            del pending[next(iter(pending))]

    def observe_return(self, trajectory_id: str, idle_gap_ms: float) -> str | None:
        """Compare the logged advice with the actual gap; returns the outcome label."""
        with self._lock:
            item = self._pending.pop(trajectory_id, None)
            if item is None:
                return None
            return self._classify(item[0], item[1], idle_gap_ms)

    def turn(
        self,
        trajectory_id: str,
        idle_gap_ms: float | None,
        advice: CacheAdvice | None,
        mode: str,
    ) -> None:
        """One model call: :meth:`observe_return` (when ``idle_gap_ms`` is known), then
        :meth:`record` of ``advice`` (when there is one), under one lock."""
        pending = self._pending
        with self._lock:
            if idle_gap_ms is not None:
                item = pending.pop(trajectory_id, None)
                if item is not None:
                    self._returns.append((item[0], item[1], idle_gap_ms))
                    if len(self._returns) >= self._BATCH:
                        self._classify_returns()
            if advice is not None:
                tid = advice.trajectory_id
                pending.pop(tid, None)  # to the end: the most recently logged
                pending[tid] = (advice, mode)
                if len(pending) > self.max_trajectories:
                    self._evict()

    def _classify_returns(self) -> None:
        returns, self._returns = self._returns, []
        for advice, mode, gap_ms in returns:
            self._classify(advice, mode, gap_ms)

    def _classify(self, advice: CacheAdvice, mode: str, idle_gap_ms: float) -> str:
        gap_ms = _gap_ms(idle_gap_ms)
        if advice.action == "retain":
            label = "retain_hit" if gap_ms <= (advice.ttl_ms or 0) else "retain_expired"
        elif advice.action in ("release", "offload"):
            label = "drop_regret" if gap_ms <= self.short_gap_s * 1000.0 else "drop_ok"
        else:
            label = str(advice.action)
        self._outcomes[label] += 1
        self._outcomes[f"{mode}:{label}"] += 1
        if advice.predicted_gap_ms is not None:
            self._errors_ms.append(abs(advice.predicted_gap_ms - gap_ms))
            if len(self._errors_ms) > 4096:
                del self._errors_ms[:2048]
        return label

    def forget(self, trajectory_id: str) -> None:
        """Drop a trajectory's pending advice (it ended)."""
        with self._lock:
            self._pending.pop(trajectory_id, None)

    def summary(self) -> dict[str, Any]:
        """Outcome counts and the median absolute gap-prediction error in ms."""
        with self._lock:
            self._classify_returns()
            errors = sorted(self._errors_ms)
            median = errors[len(errors) // 2] if errors else None
            return {"outcomes": dict(self._outcomes), "gap_abs_error_ms_p50": median}
