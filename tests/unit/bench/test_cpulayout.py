"""The split CPU layout: the plan (pure) and pinning this process (Linux)."""

from __future__ import annotations

import os

import pytest

from agentkv import ConfigError
from agentkv.bench.run._runner import BenchConfig
from agentkv.bench.testbed._cpulayout import pinned, plan_cpu_layout


def test_split_keeps_the_engine_with_the_worker_and_the_frontend_apart() -> None:
    """2 cores, worker on 0: engine core on 0, API server and client on 1."""
    plan = plan_cpu_layout({0, 1}, {0})
    assert plan == {"worker": {0}, "engine_core": {0}, "api_server": {1}, "client": {1}}


def test_nothing_to_split_when_the_worker_has_every_allowed_core() -> None:
    assert plan_cpu_layout({0, 1}, {0, 1}) is None
    assert plan_cpu_layout({0, 1}, {2}) is None  # bound outside what the server may use
    assert plan_cpu_layout({0, 1, 2, 3}, {0, 5}) == {
        "worker": {0},
        "engine_core": {0},
        "api_server": {1, 2, 3},
        "client": {1, 2, 3},
    }


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux affinity")
def test_pinned_restores_the_previous_affinity() -> None:
    before = os.sched_getaffinity(0)
    one = {min(before)}
    with pinned(sorted(one)):
        assert os.sched_getaffinity(0) == one
    assert os.sched_getaffinity(0) == before
    with pinned(None):
        assert os.sched_getaffinity(0) == before


def test_bench_config_refuses_an_unknown_layout() -> None:
    with pytest.raises(ConfigError, match="cpu_layout"):
        BenchConfig(trace_path="t.jsonl", cpu_layout="everywhere")
