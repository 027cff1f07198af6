"""The control route on a data-parallel server: one rank or every rank, one combined answer.

vLLM 0.32's ``DPLBAsyncMPClient`` (``--data-parallel-size N``) has ``core_engines`` and a
per-engine ``_call_utility_async(method, *args, engine=...)``; the fakes below have the
same two, so these tests check the routing and combining without a 3-minute DP start-up
(a real DP=2 run is described in docs/scale-out.md).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from agentkv.vllm import _control
from agentkv.vllm._fanout import (
    call_engines,
    combine_answers,
    combine_stats,
    engine_targets,
    parse_rank,
)


class _Rank:
    """One engine: knows some trajectories, has counters."""

    def __init__(self, rank: int, trajectories: set[str], stats: dict[str, Any]) -> None:
        self.rank = rank
        self.trajectories = trajectories
        self.stats = stats
        self.ops: list[dict[str, Any]] = []

    def handle(self, payload: str) -> str:
        op = json.loads(payload)
        self.ops.append(op)
        if op["op"] == "stats":
            return json.dumps(self.stats)
        if op["op"] == "trajectory":
            if op["trajectory_id"] in self.trajectories:
                return json.dumps({"trajectory_id": op["trajectory_id"], "rank": self.rank,
                                   "live_requests": 0, "cached_blocks": 3})  # fmt: skip
            return json.dumps({"status": 404, "error": "unknown trajectory"})
        if op["op"] == "events":
            return json.dumps({"accepted": len(op["events"]), "rejected": []})
        return json.dumps({"block_size": 32, "num_blocks": 63, "rank": self.rank})


class _DPCore:
    """Shaped like vLLM's DP client: ``core_engines`` + per-engine utility calls."""

    def __init__(self, ranks: list[_Rank]) -> None:
        self.ranks = ranks
        self.core_engines = [f"engine-{r.rank}".encode() for r in ranks]

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        raise AssertionError("a DP server must be addressed rank by rank")

    async def _call_utility_async(self, method: str, *args: Any, engine: bytes) -> Any:
        assert method == "agentkv_control"
        return self.ranks[self.core_engines.index(engine)].handle(*args)


class _OneCore:
    def __init__(self, rank: _Rank) -> None:
        self.rank = rank
        self.core_engines = [b"engine-0"]

    async def call_utility_async(self, method: str, *args: Any) -> Any:
        return self.rank.handle(*args)


def _stats(created: int, events: int, blocks: int, free: int, usage: float, lag: float) -> dict:
    return {"leases_created": created, "events_received": events, "num_blocks": blocks,
            "free_blocks": free, "kv_usage": usage, "hint_lag_ms_p50": lag,
            "trajectories_tracked": events, "num_waiting": 1}  # fmt: skip


def _two_ranks() -> list[_Rank]:
    return [
        _Rank(0, {"a"}, _stats(3, 2, 64, 16, 0.75, 2.0)),
        _Rank(1, {"b", "c"}, _stats(1, 5, 64, 48, 0.25, 9.0)),
    ]


def test_combine_stats_sums_counters_weights_usage_and_bounds_the_median() -> None:
    total = combine_stats([*(r.stats for r in _two_ranks()), {"error": "HTTP 503"}])
    assert total["leases_created"] == 4 and total["events_received"] == 7
    assert total["num_blocks"] == 128 and total["free_blocks"] == 64
    assert total["num_waiting"] == 2 and total["trajectories_tracked"] == 7
    assert total["kv_usage"] == pytest.approx(0.5)
    assert total["hint_lag_ms_p50"] == 9.0  # the largest part's median: an upper bound
    assert (total["parts_reporting"], total["parts_missing"]) == (2, 1)


def test_lag_histograms_add_up_and_the_return_lag_is_bounded_not_summed() -> None:
    from agentkv.residency._lag import LagStats

    a, b = LagStats(), LagStats()
    for lag_ms in (3.0, 40.0):
        a.record_ms(lag_ms)
    b.record_ms(700.0)
    parts = [{**_stats(0, 0, 64, 0, 0.0, 0), "return_lag_ms": 120.0,
              "hint_lag_seconds": a.histogram()},
             {**_stats(0, 0, 64, 0, 0.0, 0), "return_lag_ms": 80.0,
              "hint_lag_seconds": b.histogram()}]  # fmt: skip
    total = combine_stats(parts)
    assert total["return_lag_ms"] == 120.0
    hist = total["hint_lag_seconds"]
    assert hist["count"] == 3 and hist["sum_s"] == pytest.approx(0.743)
    assert dict(hist["buckets"])["0.05"] == 2 and dict(hist["buckets"])["+Inf"] == 3
    odd = {**parts[1], "hint_lag_seconds": {"buckets": [["1", 1], ["+Inf", 1]], "sum_s": 0.7,
                                            "count": 1}}  # fmt: skip
    assert "hint_lag_seconds" not in combine_stats([parts[0], odd])  # no dishonest total


def test_kv_usage_is_weighted_by_each_part_s_pool() -> None:
    total = combine_stats([_stats(0, 0, 100, 0, 1.0, 0), _stats(0, 0, 300, 300, 0.0, 0)])
    assert total["kv_usage"] == pytest.approx(0.25)


def test_combine_answers_per_operation() -> None:
    ranks = _two_ranks()
    stats = combine_answers("stats", [r.stats for r in ranks])
    assert stats["leases_created"] == 4 and stats["data_parallel_size"] == 2
    assert [p["leases_created"] for p in stats["per_rank"]] == [3, 1]
    known = {"trajectory_id": "b", "rank": 1, "live_requests": 0, "cached_blocks": 3}
    missing = {"status": 404, "error": "unknown trajectory"}
    assert combine_answers("trajectory", [missing, known]) == known
    assert combine_answers("trajectory", [missing, dict(missing)]) == missing
    caps = combine_answers("capabilities", [{"num_blocks": 63}, {"num_blocks": 63}])
    assert caps == {"num_blocks": 63, "data_parallel_size": 2}
    assert combine_answers("events", [{"accepted": 0}, {"accepted": 2}]) == {"accepted": 2}
    assert combine_answers("stats", [{"x": 1}]) == {"x": 1}  # one engine: unchanged


@pytest.mark.parametrize(
    ("header", "size", "rank"),
    [(None, 2, None), ("1", 2, 1), (" 0 ", 2, 0), ("2", 2, None), ("-1", 2, None), ("x", 2, None)],
)
def test_parse_rank(header: str | None, size: int, rank: int | None) -> None:
    assert parse_rank(header, size) == rank


def test_engine_targets_only_for_a_client_with_several_addressable_engines() -> None:
    assert len(engine_targets(_DPCore(_two_ranks()))) == 2
    assert engine_targets(_OneCore(_two_ranks()[0])) == []
    assert engine_targets(SimpleNamespace(core_engines=[1, 2])) == []  # no per-engine call


async def test_call_engines_targets_the_named_rank_or_every_rank() -> None:
    ranks = _two_ranks()
    core = _DPCore(ranks)
    payload = json.dumps({"op": "trajectory", "trajectory_id": "b"})
    one = await call_engines(core, "agentkv_control", payload, rank_header="1", timeout_s=1)
    assert [a["rank"] for a in one] == [1] and len(ranks[0].ops) == 0
    every = await call_engines(core, "agentkv_control", payload, rank_header=None, timeout_s=1)
    assert len(every) == 2 and len(ranks[0].ops) == 1
    single = _OneCore(ranks[0])
    got = await call_engines(single, "agentkv_control", payload, rank_header="1", timeout_s=1)
    assert got == [{"status": 404, "error": "unknown trajectory"}]


class _Headers(dict):  # type: ignore[type-arg]
    """Case-insensitive enough for the middleware's ``headers.get``."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)


def _request(core: Any, path: str, method: str = "GET", headers: dict[str, str] | None = None,
             body: bytes = b"") -> Any:  # fmt: skip
    state = SimpleNamespace(engine_client=SimpleNamespace(engine_core=core),
                            args=SimpleNamespace(api_key=None))  # fmt: skip

    async def read() -> bytes:
        return body

    async def stream() -> Any:
        yield body

    return SimpleNamespace(
        app=SimpleNamespace(state=state),
        url=SimpleNamespace(path=path),
        scope={"path": path, "raw_path": path.encode(), "root_path": ""},
        method=method,
        headers=_Headers({k.lower(): v for k, v in (headers or {}).items()}),
        body=read,
        stream=stream,
    )


async def _call(request: Any) -> tuple[int, Any]:
    async def never(_: Any) -> Any:
        raise AssertionError("control paths are answered by the middleware")

    response = await _control.control_middleware(request, never)
    return response.status_code, json.loads(response.body)


async def test_control_route_fans_out_on_a_data_parallel_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stats sum every rank; a trajectory is found on the rank that holds it; events go to
    the rank the request names (the one its model calls were pinned to)."""
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    ranks = _two_ranks()
    core = _DPCore(ranks)

    def req(path: str, **kw: Any) -> Any:
        return _request(core, path, **kw)

    status, stats = await _call(req("/agentkv/v1/stats"))
    assert status == 200 and stats["leases_created"] == 4 and stats["data_parallel_size"] == 2
    # The stats snapshot is cached per rank selection: one rank's is not every rank's.
    status, one = await _call(req("/agentkv/v1/stats", headers={"X-data-parallel-rank": "1"}))
    assert status == 200 and one["leases_created"] == 1 and "data_parallel_size" not in one
    for traj, rank in (("a", 0), ("c", 1)):
        status, answer = await _call(req(f"/agentkv/v1/trajectories/{traj}"))
        assert status == 200 and answer["rank"] == rank
    status, answer = await _call(req("/agentkv/v1/trajectories/nobody"))
    assert status == 404
    body = json.dumps({"events": [{"trajectoryId": "b", "event": "tool_started"}]}).encode()
    before = [len(r.ops) for r in ranks]
    pinned = {"X-data-parallel-rank": "1", "Content-Type": "application/json"}
    status, answer = await _call(req("/agentkv/v1/events", method="POST", headers=pinned, body=body))
    assert status == 200 and answer["accepted"] == 1
    assert [len(r.ops) - b for r, b in zip(ranks, before, strict=True)] == [0, 1]
    status, caps = await _call(req("/agentkv/v1/capabilities"))
    assert status == 200 and caps["data_parallel_size"] == 2
