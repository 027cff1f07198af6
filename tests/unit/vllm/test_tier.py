"""The tier split and the offload index, over the shapes vLLM 0.32 hands the plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from types import SimpleNamespace
from typing import Any

import pytest

from agentkv.vllm._blockport import OffloadIndex
from agentkv.vllm._tier import LOAD_BYTES, LOAD_TIME, STORE_BYTES, TierMeter, block_bytes


class _Result(Enum):  # the names of vLLM's LookupResult
    MISS = 0
    HIT = 1
    HIT_PENDING = 2


@dataclass
class _Manager:
    stored: dict[bytes, _Result] = field(default_factory=dict)

    def lookup(self, key: bytes, req_context: Any) -> _Result:
        return self.stored.get(key, _Result.MISS)


def _key(block_hash: bytes, group: int = 0) -> bytes:
    return block_hash + group.to_bytes(4, "big")


def test_the_offload_index_counts_whole_stored_chunks_from_the_start() -> None:
    hashes = [bytes([i]) * 4 for i in range(7)]
    manager = _Manager({_key(hashes[1]): _Result.HIT, _key(hashes[3]): _Result.HIT_PENDING})
    index = OffloadIndex(manager, hashes_per_chunk=2)
    assert index.held_prefix(hashes) == 4  # chunks (0,1) and (2,3); chunk (4,5) missing
    manager.stored[_key(hashes[5])] = _Result.HIT
    assert index.held_prefix(hashes) == 6  # hash 6 is a partial chunk, never stored
    assert OffloadIndex(manager, 2, group_idx=1).held_prefix(hashes) == 0


def test_the_offload_index_is_found_on_the_scheduler_or_not_at_all() -> None:
    groups = [SimpleNamespace(hashes_per_chunk=4, group_idx=0)]
    side = SimpleNamespace(manager=_Manager(), config=SimpleNamespace(kv_group_configs=groups))
    sched = SimpleNamespace(connector=SimpleNamespace(connector_scheduler=side))
    index = OffloadIndex.from_scheduler(sched)
    assert index is not None and index.hashes_per_chunk == 4
    assert OffloadIndex.from_scheduler(SimpleNamespace(connector=None)) is None


def _request(prompt: int, local: int, external: int) -> Any:
    stats = SimpleNamespace(num_prompt_tokens=prompt, num_local_cached_tokens=local,
                            num_external_cached_tokens=external)  # fmt: skip
    return SimpleNamespace(prefill_stats=stats)


def test_the_meter_splits_prompts_by_tier_and_learns_the_load_bandwidth() -> None:
    meter = TierMeter(lower_tier=True, block_size=16, bytes_per_block=1000)
    # 161 tokens: 10 whole blocks before the last token; 2 local, 5 from the tier
    assert meter.on_admitted(_request(161, 32, 80)) == (8, 5)
    stats = SimpleNamespace(
        is_empty=lambda: False,
        reduce=lambda: {LOAD_BYTES: 4000.0, LOAD_TIME: 0.002, STORE_BYTES: 9000.0},
    )
    reload_s = meter.on_step(
        SimpleNamespace(kv_connector_output=SimpleNamespace(kv_connector_stats=stats))
    )
    assert reload_s == pytest.approx(1000 * 0.002 / 4000)
    out = meter.stats()
    assert (
        out["tier_local_hit_tokens"],
        out["tier_hit_tokens"],
        out["tier_recomputed_tokens"],
    ) == (32, 80, 49)
    assert out["offload_load_bytes"] == 4000 and out["offload_load_bytes_per_s"] == 2_000_000
    assert out["offload_store_bytes"] == 9000 and out["offload_store_bytes_per_s"] is None
    assert meter.on_step(SimpleNamespace(kv_connector_output=None)) == reload_s


def test_without_a_tier_the_split_is_none_with_the_reason() -> None:
    meter = TierMeter(
        lower_tier=False, block_size=128, bytes_per_block=0, no_tier_reason="CPU build"
    )
    out = meter.stats()
    assert out["tier_hit_tokens"] is None and out["tier_split_reason"] == "CPU build"


def test_block_bytes_sums_every_layer_of_every_group() -> None:
    spec = SimpleNamespace(page_size_bytes=512)
    cfg = SimpleNamespace(
        kv_cache_groups=[SimpleNamespace(kv_cache_spec=spec, layer_names=["a", "b"])]
    )
    assert block_bytes(cfg) == 1024 and block_bytes(None) == 0
