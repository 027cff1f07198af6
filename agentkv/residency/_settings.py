"""The policy core's settings: limits and switches (pure data, no I/O).

The vLLM plugin receives them through the environment (see
``agentkv.vllm._settings.SchedSettings``, which extends this class); the simulator builds
them directly. Every field has the same meaning in both drivers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["PolicySettings", "Retention"]

Retention = Literal["hint", "predicted"]


@dataclass(frozen=True)
class PolicySettings:
    """Limits and switches of the lease and admission core.

    - ``retention``: ``"hint"`` leases exactly what the client advised (retain with its
      TTL) and gives up the earliest deadline first under pressure; ``"predicted"``
      leases every paused trajectory's context (the TTL only bounds it) and gives up
      the lease furthest from its predicted return first (Belady's rule on forecasts).
    - ``admission``: hold back a waiting turn whose context is not resident and does
      not fit beside the leases, instead of releasing leases for it; a held turn is
      admitted once it fits, once it can take leases expected back later than itself,
      once fewer than ``min_running`` calls run (the engine must not idle while contexts
      sit in tool gaps) unless a resident context is due back within
      ``idle_wait_turns`` mean turn times and sooner than the engine would recompute
      what admitting the turn could evict, at the prefill cost learned from its steps
      (then a short wait beats evicting the context just before it is needed; 0 never
      waits), or after ``aging_s`` or
      ``aging_turns`` mean turn times, whichever is longer (bounded wait, in the engine's
      own time scale).
    - ``max_ttl_ms`` caps every lease; ``max_retained_fraction`` caps the blocks all
      leases hold together; ``priority_bound`` bounds advised priorities;
      ``reserve_fraction`` of the pool, plus what active contexts grew by on their last
      turn, is kept free for their growth when admitting turns that are not resident.
    - ``trim`` (predicted retention): under pressure, give up only the tail blocks an
      allocation needs from the victim lease, keeping its prefix; ``decline``: shorten
      or refuse a new lease when the pool is short and its trajectory returns last.
    - ``return_lag``: learn how much later than their forecast median paused
      trajectories come back (the time outside the client's view: answer and request in
      transit, the API server) and shift forecasts by it (``ReturnForecaster.shifted``);
      never by less than zero (returns earlier than forecast are the forecasts' error).
    - Bounds against hostile or runaway clients: ``max_lease_lifetime_ms`` caps how
      long leases may hold a pause's blocks however often they are extended or taken
      again; ``max_trajectories_per_tenant`` bounds each tenant's tracked trajectories
      (its own least recently seen go first); ``tenant_retained_share`` is the share of
      the retained cap a tenant keeps even when others filled it first (their excess is
      taken back); ``max_hash_refs`` bounds the block hashes all trajectories keep.
    - ``affinity``: a trajectory whose last call arrived without its previous turn here
      (a router sent that turn to another replica) is *roaming*, and so is every
      trajectory while fewer than ``affinity_min_rate`` of the returns seen here
      followed their previous turn here: its next call is not expected here, so its
      lease is never waited for and goes first (:mod:`agentkv.residency._affinity`). On one
      server no trajectory roams.
    - ``tier_hold_cutoff``: with a lower tier, admission's hold bound shrinks in
      proportion to the share of missed blocks the tier served (:attr:`PolicyCore.tier_hit_rate`)
      and reaches zero at this share: where the tier serves most of what an eviction
      loses, a hold protects a reload, and waiting costs the held turn more than the
      reload would (in the simulator's tiered grid every hold there cost the tail and
      saved nothing on the mean). Without a tier the rate is 0 and holds are unchanged.
    """

    max_ttl_ms: int = 600_000
    max_retained_fraction: float = 0.9
    priority_bound: int = 8
    aging_s: float = 10.0
    aging_turns: float = 8.0
    service_quantum_tokens: int = 4096
    max_trajectories: int = 4096
    max_hashes_per_trajectory: int = 4096
    retention: Retention = "predicted"
    admission: bool = True
    reserve_fraction: float = 0.05
    min_running: int = 1
    idle_wait_turns: float = 2.0
    trim: bool = True
    decline: bool = True
    return_lag: bool = True
    max_lease_lifetime_ms: int = 600_000
    max_trajectories_per_tenant: int = 1024
    tenant_retained_share: float = 0.5
    max_hash_refs: int = 1 << 20
    affinity: bool = True
    affinity_min_rate: float = 0.8
    tier_hold_cutoff: float = 2.0 / 3.0
