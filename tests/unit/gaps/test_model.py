"""GapModel: fallback, EWMA, estimates, decay, events, input handling (in memory)."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest

from agentkv import GapEstimate, GapModel, TrajectoryEvent
from agentkv.gaps._model import ALL_TOOLS
from agentkv.gaps._sketch import ForwardDecay, GapPrior, TDigestSketch
from agentkv.testing import FakeClock

NOW = 1_800_000_000.0


def test_in_memory_model_needs_no_files(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTKV_HOME", str(tmp_path))
    m = GapModel()
    m.observe("shell", 1.0)
    assert m.store is None
    assert list(tmp_path.iterdir()) == []


def test_fallback_walks_subclass_class_all_tools_prior():
    m = GapModel(min_samples=3)
    assert m.estimate("shell:pytest").source == "prior"
    for g in (1.0, 2.0, 3.0):
        m.observe("shell:git", g)
    # shell:pytest has nothing, its parent shell has 3 samples (from shell:git)
    est = m.estimate("shell:pytest")
    assert (est.source, est.n, est.confident) == ("shell", 3, True)
    assert m.estimate("shell:git").source == "shell:git"
    # an unrelated class only finds the all-tools pool: answered but not confident
    web = m.estimate("web")
    assert (web.source, web.confident) == (ALL_TOOLS, False)
    assert web.n == 3


def test_small_class_falls_back_until_it_has_min_samples():
    m = GapModel(min_samples=5)
    for _ in range(10):
        m.observe("shell:git", 10.0)
    for i in range(4):
        m.observe("shell:pytest", 0.1)
        assert m.estimate("shell:pytest").source == "shell", i
    m.observe("shell:pytest", 0.1)
    est = m.estimate("shell:pytest")
    assert est.source == "shell:pytest" and est.p50 == pytest.approx(0.1)


def test_no_fallback_returns_the_class_itself():
    m = GapModel(min_samples=5)
    m.observe("a", 2.0)
    own = m.estimate("a", fallback=False)
    assert (own.source, own.n, own.confident) == ("a", 1, False)
    assert own.p50 == pytest.approx(2.0)
    assert m.estimate("missing", fallback=False).source == "prior"


def test_prior_is_answered_when_nothing_is_learned():
    prior = GapPrior(p50_s=1.0, p90_s=4.0, p99_s=30.0)
    m = GapModel(prior=prior)
    est = m.estimate("x", kind="tool")
    assert isinstance(est, GapEstimate)
    assert (est.p50, est.p90, est.p99, est.n, est.confident) == (1.0, 4.0, 30.0, 0, False)
    assert est.kind == "tool" and est.updated_at_s is None
    assert m.quantile("x", 0.9) == pytest.approx(4.0)
    qs = [m.quantile("x", q / 100) for q in range(101)]
    assert qs == sorted(qs)


def test_ewma_follows_the_formula():
    m = GapModel(ewma_alpha=0.25, min_samples=1)
    expected = None
    for g in (4.0, 8.0, 0.0, 2.0):
        m.observe("t", g)
        expected = g if expected is None else 0.25 * g + 0.75 * expected
        assert m.estimate("t").ewma == pytest.approx(expected)


def test_kinds_are_learned_separately():
    m = GapModel(min_samples=1)
    m.observe("shell", 5.0, kind="tool")
    m.observe("shell", 0.5)
    assert m.estimate("shell", kind="tool").p50 == pytest.approx(5.0)
    assert m.estimate("shell").p50 == pytest.approx(0.5)
    assert m.tool_classes("tool") == [ALL_TOOLS, "shell"]


def test_estimates_match_exact_quantiles_for_same_age_samples():
    rng = np.random.default_rng(7)
    x = rng.lognormal(0.0, 1.5, 5000)
    m = GapModel()
    for v in x:
        m.observe("t", float(v), at=NOW)
    est = m.estimate("t")
    for q, got in ((0.5, est.p50), (0.9, est.p90), (0.99, est.p99)):
        rank = float(np.mean(x <= got))
        assert abs(rank - q) <= 0.01, (q, got, np.quantile(x, q))


def test_drift_a_tool_that_got_slower_is_noticed_within_a_few_half_lives():
    clock = FakeClock(NOW)
    m = GapModel(half_life_s=3600.0, clock=clock)
    for _ in range(500):
        clock.advance(10.0)
        m.observe("build", 1.0)
    assert m.estimate("build").p90 == pytest.approx(1.0)
    for _ in range(1500):  # ~4 half-lives of the tool being ten times slower
        clock.advance(10.0)
        m.observe("build", 10.0)
    est = m.estimate("build")
    assert est.p50 == pytest.approx(10.0) and est.p90 == pytest.approx(10.0)
    # without decay the old samples would still hold a quarter of the mass
    flat = GapModel(half_life_s=None)
    for g in [1.0] * 500 + [10.0] * 1500:
        flat.observe("build", g)
    assert flat.quantile("build", 0.2) == pytest.approx(1.0)
    assert m.quantile("build", 0.2) == pytest.approx(10.0)


def test_weights_halve_per_half_life():
    clock = FakeClock(NOW)
    m = GapModel(half_life_s=100.0, clock=clock, min_samples=1)
    flat = GapModel(half_life_s=None, min_samples=1)
    for g in (1.0, 2.0, 3.0):  # relative weights 1, 2, 4: 3.0 holds 4/7 of the mass
        m.observe("t", g)
        flat.observe("t", g)
        clock.advance(100.0)
    assert flat.quantile("t", 0.5) == pytest.approx(2.0)
    assert m.quantile("t", 0.5) > 2.25
    assert m.quantile("t", 0.8) == pytest.approx(3.0)


def test_landmark_rebases_over_very_long_runs():
    clock = FakeClock(NOW)
    m = GapModel(half_life_s=1.0, clock=clock, min_samples=1)
    for i in range(300):  # 300 half-lives: weights would overflow without rebasing
        clock.advance(1.0)
        m.observe("t", float(i % 3))
    est = m.estimate("t")
    assert all(math.isfinite(v) for v in (est.p50, est.p90, est.p99))
    assert est.n == 300
    assert m.estimate("t").p99 == pytest.approx(2.0)


def test_samples_older_than_the_landmark_still_count():
    m = GapModel(half_life_s=10.0, min_samples=1)
    m.observe("t", 5.0, at=NOW)
    m.observe("t", 1.0, at=NOW - 10_000.0)  # far older: the smallest weight, not lost
    est = m.estimate("t")
    assert est.n == 2 and math.isfinite(est.p50)


def test_emit_learns_tool_durations_and_idle_gaps():
    m = GapModel(min_samples=1)
    base = {"trajectory_id": "t1", "turn_id": 1, "emitted_at_ms": 1_800_000_000_000}
    m.emit(
        TrajectoryEvent(
            event="tool_finished", tool_class="shell", duration_ms=1500.0, status="ok", **base
        )
    )
    m.emit(
        TrajectoryEvent(
            event="tool_finished", tool_class="shell", duration_ms=99.0, status="cancelled", **base
        )
    )
    m.emit(
        TrajectoryEvent(event="model_started", idle_gap_ms=2000.0, after_tool_class="shell", **base)
    )
    m.emit(TrajectoryEvent(event="model_started", idle_gap_ms=None, **base))  # first call
    m.emit(TrajectoryEvent(event="model_started", idle_gap_ms=300.0, **base))  # no tool ran
    tool = m.estimate("shell", kind="tool")
    assert (tool.n, tool.p50) == (1, pytest.approx(1.5))
    idle = m.estimate("shell")
    assert (idle.n, idle.p50) == (1, pytest.approx(2.0))
    assert idle.updated_at_s == pytest.approx(1_800_000_000.0)
    assert m.estimate(ALL_TOOLS).n == 2  # the no-tool gap is pooled with all tools


def test_invalid_gap_is_dropped_outside_strict_mode(caplog, monkeypatch):
    monkeypatch.setenv("AGENTKV_STRICT", "0")
    m = GapModel(min_samples=1)
    for bad in (-1.0, math.nan, math.inf):
        m.observe("t", bad)
    assert m.tool_classes() == []
    assert "dropped a sample" in caplog.text


def test_invalid_gap_raises_in_strict_mode():
    from agentkv import AgentKVError

    with pytest.raises(AgentKVError):
        GapModel().observe("t", -1.0)


def test_bad_arguments_are_errors():
    from agentkv import ConfigError

    m = GapModel()
    with pytest.raises(ValueError):
        m.observe("t", 1.0, kind="nope")
    with pytest.raises(ValueError):
        m.observe("", 1.0)
    with pytest.raises(ValueError):
        m.quantile("t", 1.5)
    with pytest.raises(ConfigError):
        GapModel(half_life_s=0.0)
    with pytest.raises(ConfigError):
        GapModel(ewma_alpha=0.0)


def test_max_classes_bounds_memory(caplog, monkeypatch):
    m = GapModel(max_classes=2, min_samples=1)
    m.observe("shell", 1.0)
    for i in range(50):
        m.observe(f"shell:cmd{i}", 2.0)
    assert len(m.tool_classes()) == 3  # "*", "shell", and one subclass
    assert m.estimate(ALL_TOOLS).n == 51
    assert "max_classes" in caplog.text


def test_threads_observing_at_once_lose_nothing():
    m = GapModel(min_samples=1)

    def work(k: int) -> None:
        for i in range(2000):
            m.observe(f"t{k % 2}", float(i % 7))
            if i % 100 == 0:
                m.estimate(f"t{k % 2}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert m.estimate(ALL_TOOLS).n == 8000
    assert m.estimate("t0").n == 4000


def test_sketch_round_trips_and_rejects_garbage():
    s = TDigestSketch()
    for i in range(1, 501):
        s.add(float(i), 3.0)
    back = TDigestSketch.from_bytes(s.to_bytes())
    assert [back.quantile(q) for q in (0.1, 0.5, 0.9)] == [s.quantile(q) for q in (0.1, 0.5, 0.9)]
    assert back.total_weight == pytest.approx(1500.0)
    for junk in (b"", b"XXXX" + bytes(60), s.to_bytes()[:-3]):
        with pytest.raises(ValueError):
            TDigestSketch.from_bytes(junk)
    assert math.isnan(TDigestSketch.from_bytes(TDigestSketch().to_bytes()).quantile(0.5))


def test_sketch_scale_keeps_quantiles():
    s = TDigestSketch()
    for i in range(1, 101):
        s.add(float(i), 1000.0)
    before = [s.quantile(q) for q in (0.1, 0.5, 0.9, 0.99)]
    s.scale(0.5)
    assert [s.quantile(q) for q in (0.1, 0.5, 0.9, 0.99)] == pytest.approx(before, rel=1e-4)
    assert s.total_weight == pytest.approx(50_000.0)


def test_forward_decay_landmark_choice_bounds_weights():
    d = ForwardDecay(10.0)
    assert d.weight(NOW, NOW - 10.0) == pytest.approx(2.0)
    assert d.weight(NOW - 50.0, NOW) == 1.0  # never below 1
    lm = d.choose_landmark([NOW - 1e9], NOW)  # an ancient landmark is squashed
    assert d.weight(NOW, lm) <= 2.0**40
    assert ForwardDecay(None).weight(NOW, 0.0) == 1.0


def test_estimate_reuses_quantiles_briefly_but_counts_are_always_current():
    m = GapModel(half_life_s=None, min_samples=1)
    for _ in range(1000):
        m.observe("t", 1.0)
    assert m.estimate("t").p99 == pytest.approx(1.0)
    for _ in range(4):  # 0.4% of the weight: quantiles may be reused...
        m.observe("t", 100.0)
    est = m.estimate("t")
    assert est.n == 1004 and est.ewma > 1.0  # ...but n and the EWMA are current
    for _ in range(20):  # past 0.5% new weight: recomputed
        m.observe("t", 100.0)
    assert m.estimate("t").p99 == pytest.approx(100.0)
    assert m.quantile("t", 0.999) == pytest.approx(100.0)  # quantile() is never stale


def test_export_then_import_gives_back_the_same_estimates() -> None:
    """The model's state travels as records (what the store keeps) and loads back whole."""
    source = GapModel(min_samples=2)
    for i in range(60):
        source.observe("shell:pytest", 0.05 * (i % 17))
        source.observe("browser", 3.0 + 0.1 * (i % 5), kind="tool")
    records = source.export_records()
    assert {(r.kind, r.tool_class) for r in records} == {
        ("idle", "shell:pytest"),
        ("idle", "shell"),
        ("idle", "*"),
        ("tool", "browser"),
        ("tool", "*"),
    }
    copy = GapModel(min_samples=2)
    copy.import_records(records)
    for cls, kind in (("shell:pytest", "idle"), ("shell", "idle"), ("browser", "tool")):
        a, b = source.estimate(cls, kind=kind), copy.estimate(cls, kind=kind)
        assert (a.n, a.source) == (b.n, b.source)
        assert b.p50 == pytest.approx(a.p50) and b.p99 == pytest.approx(a.p99)
        assert b.ewma == pytest.approx(a.ewma)
