"""The tier split, read from vLLM's own counters inside the engine: :class:`TierMeter`.

Where a prompt's tokens came from, per request at its first admission (vLLM's
``request.prefill_stats``, the source of ``vllm:prefix_cache_hits`` and
``vllm:external_prefix_cache_hits``): the device's prefix cache (``tier_local_hit_tokens``),
the offloading connector's CPU tier (``tier_hit_tokens``) or neither
(``tier_recomputed_tokens``); and what the connector moved, from the stats its workers
send with each step's output (the source of ``vllm:kv_offload_{load,store}_{bytes,time}``):
``offload_load_bytes`` / ``offload_load_ms``, ``offload_store_bytes`` /
``offload_store_ms``. The load bandwidth sets what reloading one block costs the policy
(:attr:`VllmBlockPort.reload_s`), and every admitted turn teaches the core how often the
tier held what the device had lost (:meth:`PolicyCore.observe_reload`).

Without a lower tier (the CPU build) the split is not reported: :meth:`TierMeter.stats`
says why instead.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LOAD_BYTES", "LOAD_TIME", "STORE_BYTES", "STORE_TIME", "TierMeter", "block_bytes"]

#: vLLM 0.32's names for the offloading connector's transfer counters (the keys of
#: ``OffloadingConnectorStats.reduce()``; Prometheus adds ``_total``).
LOAD_BYTES = "vllm:kv_offload_load_bytes"
LOAD_TIME = "vllm:kv_offload_load_time"
STORE_BYTES = "vllm:kv_offload_store_bytes"
STORE_TIME = "vllm:kv_offload_store_time"


def block_bytes(kv_cache_config: Any) -> int:
    """Bytes one block holds over every layer of every KV-cache group (0: unknown)."""
    total = 0
    for group in getattr(kv_cache_config, "kv_cache_groups", ()) or ():
        spec = getattr(group, "kv_cache_spec", None)
        page = int(getattr(spec, "page_size_bytes", 0) or 0)
        total += page * len(getattr(group, "layer_names", ()) or ())
    return total


class TierMeter:
    """Counts the tier split and the connector's transfers (see the module docstring).

    ``lower_tier``: the engine runs an offloading connector; ``block_size``: tokens per
    block; ``bytes_per_block``: KV bytes of one block (0: unknown, no bandwidth is
    derived); ``no_tier_reason``: why there is no split, where there is no tier.
    """

    def __init__(
        self, *, lower_tier: bool, block_size: int, bytes_per_block: int, no_tier_reason: str = ""
    ) -> None:
        self.lower_tier = lower_tier
        self.block_size = max(1, int(block_size))
        self.bytes_per_block = max(0, int(bytes_per_block))
        self.no_tier_reason = no_tier_reason or "the server has no lower KV tier"
        self.local_hit_tokens = 0
        self.tier_hit_tokens = 0
        self.recomputed_tokens = 0
        self.load_bytes = 0.0
        self.load_s = 0.0
        self.store_bytes = 0.0
        self.store_s = 0.0

    def on_admitted(self, request: Any) -> tuple[int, int] | None:
        """A request's first admission: counts where its prompt came from; returns
        (blocks the device lacked, blocks of those the tier held) for the policy core,
        or None when vLLM gave no breakdown."""
        ps = getattr(request, "prefill_stats", None)
        if ps is None:
            return None
        prompt = int(ps.num_prompt_tokens)
        local = int(ps.num_local_cached_tokens)
        external = int(ps.num_external_cached_tokens)
        if prompt <= 0:
            return None
        self.local_hit_tokens += local
        self.tier_hit_tokens += external
        self.recomputed_tokens += max(0, prompt - local - external)
        bs = self.block_size
        missing = max(0, (prompt - 1) // bs - local // bs)
        return missing, min(missing, external // bs)

    def on_step(self, model_runner_output: Any) -> float | None:
        """A step's output: adds the connector's transfers; returns the seconds to load
        one block back, learned from all loads so far (None: none seen, or unknown size)."""
        out = getattr(model_runner_output, "kv_connector_output", None)
        stats = getattr(out, "kv_connector_stats", None)
        if stats is None or not callable(getattr(stats, "reduce", None)):
            return self.reload_s_per_block
        if callable(getattr(stats, "is_empty", None)) and stats.is_empty():
            return self.reload_s_per_block
        figures = stats.reduce()
        self.load_bytes += float(figures.get(LOAD_BYTES, 0.0))
        self.load_s += float(figures.get(LOAD_TIME, 0.0))
        self.store_bytes += float(figures.get(STORE_BYTES, 0.0))
        self.store_s += float(figures.get(STORE_TIME, 0.0))
        return self.reload_s_per_block

    @property
    def reload_s_per_block(self) -> float | None:
        """Seconds to load one block from the tier, at the bandwidth loads achieved."""
        if self.load_bytes <= 0 or self.load_s <= 0 or self.bytes_per_block <= 0:
            return None
        return self.bytes_per_block * self.load_s / self.load_bytes

    def stats(self) -> dict[str, Any]:
        """The split for the plugin's stats (and ``agentkv_*`` series); without a tier,
        the token counts are None and ``tier_split_reason`` says why."""
        if not self.lower_tier:
            return {
                "tier_local_hit_tokens": None,
                "tier_hit_tokens": None,
                "tier_recomputed_tokens": None,
                "tier_split_reason": self.no_tier_reason,
            }
        load_bps = self.load_bytes / self.load_s if self.load_s > 0 else None
        store_bps = self.store_bytes / self.store_s if self.store_s > 0 else None
        return {
            "tier_local_hit_tokens": self.local_hit_tokens,
            "tier_hit_tokens": self.tier_hit_tokens,
            "tier_recomputed_tokens": self.recomputed_tokens,
            "offload_load_bytes": round(self.load_bytes),
            "offload_load_ms": round(self.load_s * 1000.0, 3),
            "offload_store_bytes": round(self.store_bytes),
            "offload_store_ms": round(self.store_s * 1000.0, 3),
            "offload_load_bytes_per_s": None if load_bps is None else round(load_bps),
            "offload_store_bytes_per_s": None if store_bps is None else round(store_bps),
        }
