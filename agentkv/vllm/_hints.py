"""What the scheduler plugin reads from a request's hint and from vLLM's config (pure).

The hint itself is decoded by the request-hint codec (:mod:`agentkv.protocol._hints`).
"""

from __future__ import annotations

from typing import Any

from agentkv.protocol._hints import Hint
from agentkv.residency._forecast import Forecast
from agentkv.residency._strategies import FinishIntent

__all__ = ["LOWER_TIER_CONNECTORS", "has_lower_tier", "intent_of"]

#: vLLM 0.32's connectors that keep KV in a lower tier (``--kv-offloading-backend native``
#: sets the first or, with ``VLLM_USE_SIMPLE_KV_OFFLOAD``, the second; ``lmcache`` the
#: others). A disaggregated-prefill connector (NIXL, Mooncake) is not a lower tier.
LOWER_TIER_CONNECTORS = frozenset(
    {
        "OffloadingConnector",
        "SimpleCPUOffloadConnector",
        "LMCacheMPConnector",
        "LMCacheConnectorV1",
    }
)


def intent_of(hint: Hint) -> FinishIntent:
    """What the residency controller reads from a request's hint when its turn finishes:
    the advised action and TTL, and the gap forecast (its quantiles, else the TTL)."""
    forecast = Forecast.from_hint_ms(hint.gap_ms, hint.gap_p90_ms, hint.gap_p99_ms, hint.ttl_ms)
    return FinishIntent(hint.action, hint.ttl_ms, forecast, hint.reason)


def has_lower_tier(kv_transfer_config: Any) -> bool:
    """True when vLLM's KV-transfer config names a connector that offloads to a lower
    tier (see :data:`LOWER_TIER_CONNECTORS`); a ``MultiConnector`` counts when one of
    its connectors does."""
    if kv_transfer_config is None:
        return False
    name = getattr(kv_transfer_config, "kv_connector", None)
    if name in LOWER_TIER_CONNECTORS:
        return True
    if name == "MultiConnector":
        extra = getattr(kv_transfer_config, "kv_connector_extra_config", None) or {}
        subs = extra.get("connectors", []) if isinstance(extra, dict) else []
        return any(isinstance(c, dict) and c.get("kv_connector") in LOWER_TIER_CONNECTORS
                   for c in subs)  # fmt: skip
    return False
