"""Session routing can follow a real router's split (the placement a bench run recorded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentkv._errors import ConfigError
from agentkv.sim import Router, SimConfig, simulate, synthesize
from agentkv.sim._routing import load_placement


def test_placement_overrides_the_ring_and_ignores_bad_replicas() -> None:
    ring = Router("session", 2)
    ids = [f"t{i}" for i in range(20)]
    flipped = {i: 1 - ring.session_replica(i) for i in ids[:10]}
    router = Router("session", 2, placement={**flipped, "t10": 7})
    assert all(router.session_replica(i) == r for i, r in flipped.items())
    assert all(router.session_replica(i) == ring.session_replica(i) for i in ids[10:])


def test_load_placement_reads_a_bench_results_file(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"arms": {
        "B": {"jct_mean_s": 1.0},
        "E": {"replicas": {"placement_by_index": {"0": 1, "1": 0, "2": 1}}},
    }}))  # fmt: skip
    assert load_placement(path) == {"t0": 1, "t1": 0, "t2": 1}
    path.write_text(json.dumps({"arms": {"B": {"replicas": {"placement_by_index": None}}}}))
    with pytest.raises(ConfigError, match="agentkv plugin"):
        load_placement(path)


def test_all_on_one_replica_reuses_like_one_server_with_that_pool() -> None:
    """A placement that puts every trajectory on replica 0 leaves replica 1 idle."""
    workload = synthesize(8, 4, seed=3, arrival_rate_per_s=None)
    all_on_zero = tuple((t.trajectory_id, 0) for t in workload)
    cfg = SimConfig(block_size=32, pool_blocks=400, replicas=2, routing="session")
    split = simulate(workload, cfg.with_(placement=all_on_zero), ["lru"])["lru"]
    one = simulate(workload, cfg.with_(replicas=1), ["lru"])["lru"]
    assert split["prefix_reuse_ratio"] == pytest.approx(one["prefix_reuse_ratio"])
