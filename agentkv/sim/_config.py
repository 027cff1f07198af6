"""Simulator settings: the cost model, the lower tier, the replica and the run."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from agentkv._errors import ConfigError

__all__ = ["QueueOrder", "Routing", "SimConfig", "SimCost", "TierConfig"]

QueueOrder = Literal["fcfs", "priority", "plas"]
Routing = Literal["round_robin", "session", "prefix"]


@dataclass(frozen=True, slots=True)
class SimCost:
    """How long model work takes on one replica.

    Prefill of ``n`` new tokens after ``c`` cached ones costs
    ``overhead_s + n / prefill_tokens_per_s + attention_s_per_token2 * n * (c + n / 2)``
    seconds; prefills on a replica run one after another. Decode costs ``decode_s_per_token`` per
    output token and runs concurrently for up to ``max_num_seqs`` requests.
    """

    prefill_tokens_per_s: float = 20000.0
    attention_s_per_token2: float = 0.0
    decode_s_per_token: float = 0.02
    overhead_s: float = 0.0  # fixed cost of a call that computes at least one token

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Seconds to prefill ``new_tokens`` on top of ``cached_tokens`` already in cache."""
        if new_tokens <= 0:
            return 0.0
        linear = self.overhead_s + new_tokens / self.prefill_tokens_per_s
        return linear + self.attention_s_per_token2 * new_tokens * (cached_tokens + new_tokens / 2)

    def decode_s(self, output_tokens: int) -> float:
        """Seconds to decode ``output_tokens``."""
        return max(0, output_tokens) * self.decode_s_per_token


@dataclass(frozen=True, slots=True)
class TierConfig:
    """A lower KV tier (CPU memory behind the accelerator): capacity, bandwidth, latency."""

    capacity_blocks: int
    bandwidth_bytes_per_s: float = 16e9
    latency_s: float = 0.0005


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything one simulation run needs besides the workload and the policy.

    ``pool_blocks`` sizes each replica's KV pool directly; otherwise ``pool_fraction`` of
    the workload's working set (peak blocks of concurrently live trajectories) is used.
    The pool never gets fewer blocks than the largest single request needs.
    """

    block_size: int = 128
    pool_fraction: float = 0.5
    pool_blocks: int | None = None
    kv_bytes_per_token: int = 131_072
    max_num_seqs: int = 64
    queue: QueueOrder = "fcfs"
    replicas: int = 1
    routing: Routing = "session"
    arrival_rate_per_s: float | None = 0.5
    seed: int = 0
    cost: SimCost = field(default_factory=SimCost)
    lower_tier: TierConfig | None = None

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
        if self.queue not in ("fcfs", "priority", "plas"):
            raise ConfigError(f"queue {self.queue!r}: choose fcfs, priority or plas")
        if self.routing not in ("round_robin", "session", "prefix"):
            raise ConfigError(f"routing {self.routing!r}: choose round_robin, session or prefix")
        if self.arrival_rate_per_s is not None and not self.arrival_rate_per_s > 0:
            raise ConfigError("arrival_rate_per_s must be > 0 (or None: all start at once)")
        if self.cost.prefill_tokens_per_s <= 0 or self.cost.decode_s_per_token < 0:
            raise ConfigError("prefill_tokens_per_s must be > 0 and decode_s_per_token >= 0")

    @property
    def block_bytes(self) -> int:
        """Bytes of KV per block."""
        return self.block_size * self.kv_bytes_per_token

    def with_(self, **changes: object) -> SimConfig:
        """Return a copy with ``changes`` applied (validated again)."""
        return replace(self, **changes)  # type: ignore[arg-type]
