"""The tier split as the servers measured it: :class:`TierLedger`.

OpenAI usage reports one ``cached_tokens`` figure, whether the blocks were still on the
GPU or loaded back from a lower tier, so the client cannot split reuse by itself. An
agentkv-served vLLM counts the split inside the engine and serves it in
``/agentkv/v1/stats`` (``tier_local_hit_tokens``, ``tier_hit_tokens``,
``tier_recomputed_tokens``, ``offload_{load,store}_{bytes,ms}``). The lifecycle channel
already reads that answer for each active server's load, at most once a second and off
the call path; it hands every answer to :func:`observe_stats`, and nothing else asks.

Invariants:

- The figures of a server are differences of its monotone counters: the latest answer
  minus the first one this ledger saw. A counter that goes down means the server
  restarted; what was counted before is kept and the new process counts from zero.
- A server without a lower tier (its stats carry ``tier_split_reason``), or whose stats
  do not carry the split at all, contributes no figures, only its reason.
- :meth:`TierLedger.split` sums the servers that report the split; its figures are None
  only when none does, and ``reason`` then says why (the servers' own reasons).

The counters cover every request the server admitted, this process's and any other
client's, at the granularity of the channel's reads: they are not per turn.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["COUNTERS", "TierLedger", "TierSplit", "get_ledger", "observe_stats", "reset"]

#: The server's monotone counters the split is made of (keys of its stats answer).
COUNTERS = (
    "tier_local_hit_tokens",
    "tier_hit_tokens",
    "tier_recomputed_tokens",
    "offload_load_bytes",
    "offload_load_ms",
    "offload_store_bytes",
    "offload_store_ms",
)

#: Reason given before any server's stats were read.
NOT_SEEN_REASON = "no agentkv-served server's stats read yet"
#: Reason given for a server whose stats carry neither the split nor a reason.
NOT_SERVED_REASON = "the server's stats do not report the tier split (an older agentkv plugin?)"
MAX_SERVERS = 1024


@dataclass(frozen=True, slots=True)
class TierSplit:
    """The split summed over the servers that report it (None: none does; ``reason``)."""

    local_hit_tokens: int | None = None
    tier_hit_tokens: int | None = None
    recomputed_tokens: int | None = None
    load_bytes: int | None = None
    store_bytes: int | None = None
    load_bytes_per_s: float | None = None
    store_bytes_per_s: float | None = None
    reason: str | None = NOT_SEEN_REASON


def _counters(stats: Mapping[str, Any]) -> dict[str, float] | None:
    """The counters of one answer, or None where any is missing or not a number."""
    out: dict[str, float] = {}
    for key in COUNTERS:
        value = stats.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            return None
        out[key] = max(float(value), 0.0)
    return out


class _Server:
    """One server: the first counters seen, the latest, and what a restart carried over."""

    __slots__ = ("base", "carried", "latest", "reason")

    def __init__(self) -> None:
        self.base: dict[str, float] | None = None
        self.latest: dict[str, float] = {}
        self.carried: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
        self.reason: str | None = None

    def observe(self, stats: Mapping[str, Any]) -> None:
        counters = _counters(stats)
        if counters is None:
            reason = stats.get("tier_split_reason")
            self.reason = reason if isinstance(reason, str) and reason else NOT_SERVED_REASON
            return
        self.reason = None
        if self.base is None:
            self.base, self.latest = counters, counters
            return
        if any(counters[k] < self.latest[k] for k in COUNTERS):  # restarted: count anew
            for k in COUNTERS:
                self.carried[k] += self.latest[k] - self.base[k]
            self.base = dict.fromkeys(COUNTERS, 0.0)
        self.latest = counters

    def delta(self) -> dict[str, float] | None:
        if self.reason is not None or self.base is None:
            return None
        return {k: self.carried[k] + self.latest[k] - self.base[k] for k in COUNTERS}


class TierLedger:
    """Per-server tier counters, summed into a :class:`TierSplit` (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[str, _Server] = {}

    def observe(self, server: str, stats: Mapping[str, Any]) -> None:
        """Take one ``/agentkv/v1/stats`` answer of ``server`` (its control URL)."""
        with self._lock:
            entry = self._servers.get(server)
            if entry is None:
                if len(self._servers) >= MAX_SERVERS:
                    return
                entry = self._servers[server] = _Server()
            entry.observe(stats)

    def split(self) -> TierSplit:
        """The split since each server was first seen, summed over the servers."""
        with self._lock:
            deltas = [(url, s.delta(), s.reason) for url, s in self._servers.items()]
        reported = [d for _, d, _ in deltas if d is not None]
        missing = sorted({r for _, d, r in deltas if d is None and r is not None})
        if not reported:
            return TierSplit(reason="; ".join(missing) if missing else NOT_SEEN_REASON)
        total = {k: sum(d[k] for d in reported) for k in COUNTERS}
        load_s = total["offload_load_ms"] / 1000.0
        store_s = total["offload_store_ms"] / 1000.0
        unreported = len(deltas) - len(reported)
        return TierSplit(
            local_hit_tokens=round(total["tier_local_hit_tokens"]),
            tier_hit_tokens=round(total["tier_hit_tokens"]),
            recomputed_tokens=round(total["tier_recomputed_tokens"]),
            load_bytes=round(total["offload_load_bytes"]),
            store_bytes=round(total["offload_store_bytes"]),
            load_bytes_per_s=total["offload_load_bytes"] / load_s if load_s > 0 else None,
            store_bytes_per_s=total["offload_store_bytes"] / store_s if store_s > 0 else None,
            reason=(
                f"{unreported} of {len(deltas)} servers do not report it: {'; '.join(missing)}"
                if unreported
                else None
            ),
        )


_ledger = TierLedger()


def get_ledger() -> TierLedger:
    """The process's tier ledger."""
    return _ledger


def observe_stats(server: str, stats: Mapping[str, Any]) -> None:
    """Hand one stats answer of ``server`` to the process's ledger."""
    _ledger.observe(server, stats)


def reset() -> None:
    """Forget every server (the next answer of each is its new starting point)."""
    global _ledger
    _ledger = TierLedger()
