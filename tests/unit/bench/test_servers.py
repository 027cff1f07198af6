"""The server sets and the one pool runner: run order, cold caches, clean-up."""

from __future__ import annotations

import random
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from agentkv.bench.run import _runner, _servers
from agentkv.bench.run._arms import arm_options
from agentkv.bench.run._replicas import ReplicaServers
from agentkv.bench.run._runner import BenchConfig, run_pool
from agentkv.bench.run._servers import ArmServers, BaseServerSet, Stage
from agentkv.workload._pool import plan_pool
from tests.support.bench_fakes import platform_info

PLAN, _ = plan_pool(10_000, 0.3, 1_000, 32)
CPU = platform_info("cpu", fp8=False)


def _options(arm: str) -> dict[str, Any]:
    return arm_options(arm, PLAN, CPU)


def test_one_server_per_arm_is_one_stage_with_each_repetition_shuffled() -> None:
    """Every arm is up at once; each repetition visits every arm once, in the order a
    shuffle per repetition draws (the same draws as shuffling between repetitions)."""
    arms = ["B", "E", "G", "L"]
    servers = ArmServers(BenchConfig("t", arms=tuple(arms)), PLAN, _options, lambda k, d: None, CPU)
    stages = servers.stages(arms, 3, random.Random(5))
    assert [s.arms for s in stages] == [tuple(arms)]
    rng = random.Random(5)
    expected = []
    for rep in range(3):
        order = list(arms)
        rng.shuffle(order)
        expected += [(rep, position, arm) for position, arm in enumerate(order)]
    assert stages[0].replays == tuple(expected)


def test_replicas_run_one_arm_at_a_time_in_the_shared_replica_order() -> None:
    """Behind a router each arm is its own stage and runs every repetition before the
    next; its position is its place in the order that keeps B and R adjacent."""
    arms = ("B", "E", "G", "R", "R+")
    cfg = BenchConfig("t", arms=arms, replicas=2)
    servers = ReplicaServers(cfg, PLAN, _options, lambda k, d: None)
    stages = servers.stages(arms, 2, random.Random(3))
    order = servers.order(arms, random.Random(3))
    assert [s.arms for s in stages] == [(arm,) for arm in order]
    for position, stage in enumerate(stages):
        assert stage.replays == ((0, position, stage.arms[0]), (1, position, stage.arms[0]))


class _Log(BaseServerSet):
    """A server set that records what the runner asks of it (no servers)."""

    def __init__(self, stages: list[Stage], fail_on: str | None = None) -> None:
        super().__init__(SimpleNamespace(), PLAN, _options, lambda kind, data: None)
        self._stages, self.fail_on, self.calls = stages, fail_on, []

    def stages(self, arms: Sequence[str], reps: int, rng: random.Random) -> list[Stage]:
        return self._stages

    def start(self, arms: Sequence[str]) -> None:
        self.calls.append(("start", tuple(arms)))
        for arm in arms:
            self.argv[arm] = [f"--{arm}"]

    def calibrate(self, arm: str, plan: Any) -> dict[str, Any]:
        self.calls.append(("calibrate", arm))
        return {"arm": arm}

    def release(self, arm: str) -> None:
        self.calls.append(("release", arm))

    def stop_all(self) -> None:
        self.calls.append(("stop_all",))


def _run(monkeypatch: pytest.MonkeyPatch, servers: _Log) -> tuple[list[Any], dict[str, Any]]:
    def replay_once(run: Any, s: Any, arm: str, rep: int, position: int, fraction: float) -> Any:
        if arm == servers.fail_on:
            raise RuntimeError("replay failed")
        servers.calls.append(("replay", arm, rep, position))
        return (arm, rep, position)

    monkeypatch.setattr(_runner, "_replay_once", replay_once)
    monkeypatch.setattr(
        _runner.CalibrationPlan, "for_workload", classmethod(lambda cls, *a: "calibration")
    )
    run = SimpleNamespace(
        cfg=SimpleNamespace(reps=2, measure_testbed=True, arrival=None, seed=0),
        workload=None,
        synth=None,
    )
    record: dict[str, Any] = {"cpu_layout": {}, "testbed": {}}
    reps, argv = run_pool(run, servers, 0.5, ["B", "E"], random.Random(0), record)  # type: ignore[arg-type]
    return reps, {"argv": argv, **record}


def test_the_pool_runner_starts_measures_replays_and_releases_stage_by_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per stage: start its arms, measure each one's testbed, run its replays in the
    stage's order, release its arms; stop everything at the end."""
    stages = [
        Stage(("E",), ((0, 0, "E"), (1, 0, "E"))),
        Stage(("B", "L"), ((0, 0, "L"), (0, 1, "B"))),
    ]
    servers = _Log(stages)
    reps, record = _run(monkeypatch, servers)
    assert servers.calls == [
        ("start", ("E",)), ("calibrate", "E"),
        ("replay", "E", 0, 0), ("replay", "E", 1, 0), ("release", "E"),
        ("start", ("B", "L")), ("calibrate", "B"), ("calibrate", "L"),
        ("replay", "L", 0, 0), ("replay", "B", 0, 1), ("release", "B"), ("release", "L"),
        ("stop_all",),
    ]  # fmt: skip
    assert reps == [("E", 0, 0), ("E", 1, 0), ("L", 0, 0), ("B", 0, 1)]
    assert record["argv"] == {"E@0.5": ["--E"], "B@0.5": ["--B"], "L@0.5": ["--L"]}
    assert record["testbed"] == {
        "E@0.5": {"arm": "E"},
        "B@0.5": {"arm": "B"},
        "L@0.5": {"arm": "L"},
    }
    assert record["cpu_layout"] == {"E@0.5": None, "B@0.5": None, "L@0.5": None}


def test_the_pool_runner_stops_every_server_when_a_replay_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    servers = _Log([Stage(("B",), ((0, 0, "B"),))], fail_on="B")
    with pytest.raises(RuntimeError, match="replay failed"):
        _run(monkeypatch, servers)
    assert servers.calls[-1] == ("stop_all",)


class _Caches(BaseServerSet):
    """Servers that start with an empty cache and restart on request (no processes)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        super().__init__(SimpleNamespace(), PLAN, _options, lambda k, d: self.events.append((k, d)))
        self.launches = 0

    def _launch(self, arm: str) -> None:
        self.launches += 1
        self.servers[arm] = SimpleNamespace(base_url=f"http://{arm}:{self.launches}")
        self.fresh.add(arm)

    def _restart(self, arm: str) -> None:
        self._start_one(arm)


def test_a_cache_is_fresh_after_start_then_reset_then_restarted_when_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first replay after a start finds a fresh cache; later ones reset it; a
    refused reset restarts the server (announced), whose cache then counts as emptied."""
    answers = iter([True, False])
    asked: list[list[str]] = []

    def reset(urls: list[str]) -> bool:
        asked.append(urls)
        return next(answers)

    monkeypatch.setattr(_servers, "reset_caches", reset)
    servers = _Caches()
    servers._start_one("E")
    assert [servers.cold("E") for _ in range(3)] == ["fresh", "reset", "restart"]
    assert asked == [["http://E:1"], ["http://E:1"]] and servers.launches == 2
    kinds = [k for k, _ in servers.events]
    assert kinds == [
        "server_starting",
        "server_ready",
        "server_restart",
        "server_starting",
        "server_ready",
    ]
    assert "E" not in servers.fresh  # the restart emptied the cache for this replay


def test_a_reset_asks_every_replica_even_after_one_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def one(url: str) -> bool:
        asked.append(url)
        return url != "http://a"

    monkeypatch.setattr(_servers, "_reset", one)
    assert not _servers.reset_caches(["http://a", "http://b"])
    assert asked == ["http://a", "http://b"]
    assert _servers.reset_caches(["http://b"])
