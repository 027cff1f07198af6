"""The tool gaps' scale follows the measured prefill rate (``agentkv demo``,
``agentkv bench --time-scale-from-prefill``): pure logic here; the real run is in
``tests/server/test_bench.py``."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any, cast

import pytest

from agentkv._demo import demo_config, demo_trace_path
from agentkv._errors import ConfigError
from agentkv.bench.run import _runner
from agentkv.bench.run._gapscale import GapScaleRule, describe_gap_scale, measured_prefill_rate
from agentkv.bench.run._runner import BenchConfig
from agentkv.traces import load_trace
from agentkv.workload import make_workload
from agentkv.workload._warm import make_warmup
from agentkv.workload._workload import Scaling

SCALING = Scaling(token_scale=0.15, time_scale=0.3, max_trajectories=12, max_turns=6)


def _unit_means() -> tuple[float, float]:
    """The demo workload's mean prompt (tokens) and mean tool gap at time scale 1 (s)."""
    w = make_workload(load_trace(demo_trace_path()), replace(SCALING, time_scale=1.0))
    prompts = [t.prompt_tokens for tr in w.trajectories for t in tr.turns]
    gaps = [t.tool_gap_s for tr in w.trajectories for t in tr.turns if t.tool_gap_s]
    return statistics.fmean(prompts), statistics.fmean(gaps)


def test_a_slow_prefill_keeps_the_usual_scale_and_a_fast_one_shortens_the_gaps() -> None:
    """Without AVX-512 (2,800 tokens/s) a rebuild is already most of a gap: x0.3 stays.
    At 35,000 tokens/s the gaps shrink until a rebuild is a quarter of the mean gap."""
    trace = load_trace(demo_trace_path())
    rule = GapScaleRule()
    slow, why_slow = rule.resolve(trace, SCALING, 2_800.0)
    assert slow.time_scale == 0.3 and why_slow["time_scale"] == 0.3
    fast, why = rule.resolve(trace, SCALING, 35_000.0)
    context, gap = _unit_means()
    assert why["rebuild_s"] == pytest.approx(context / 35_000.0)
    assert fast.time_scale == pytest.approx(context / 35_000.0 / (0.25 * gap))
    assert 0.05 < fast.time_scale < 0.3
    # the rebuild is exactly the rule's share of the scaled mean gap
    assert why["rebuild_s"] / (gap * fast.time_scale) == pytest.approx(0.25)
    # only the gaps change: every token count, and so the pool plan, is the same
    tokens = [
        (t.prompt_tokens, t.output_tokens, t.shared_prefix_tokens)
        for w in (make_workload(trace, SCALING), make_workload(trace, fast))
        for tr in w.trajectories
        for t in tr.turns
    ]
    half = len(tokens) // 2
    assert tokens[:half] == tokens[half:]


def test_the_scale_stays_between_its_bounds() -> None:
    """A very fast machine gets the floor; a rate that says nothing keeps the cap."""
    trace = load_trace(demo_trace_path())
    rule = GapScaleRule(min_scale=0.1, max_scale=0.3)
    assert rule.resolve(trace, SCALING, 5e6)[0].time_scale == 0.1
    for rate in (None, 0.0, -3.0):
        scaling, why = rule.resolve(trace, SCALING, rate)
        assert scaling.time_scale == 0.3 and why["reason"] == "prefill rate not measured"
        assert "not measured" in describe_gap_scale(why)


def test_a_workload_without_gaps_keeps_the_cap() -> None:
    """One turn per trajectory: there is no gap to scale, and the record says so."""
    trace = load_trace(demo_trace_path())
    scaling, why = GapScaleRule().resolve(trace, replace(SCALING, max_turns=1), 35_000.0)
    assert scaling.time_scale == 0.3 and why["reason"] == "the workload has no tool gaps"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rebuild_share": 0.0}, "rebuild_share"),
        ({"rebuild_share": float("nan")}, "rebuild_share"),
        ({"min_scale": 0.0}, "min_scale"),
        ({"min_scale": 0.5, "max_scale": 0.3}, "min_scale <= max_scale"),
    ],
)
def test_a_bad_rule_is_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GapScaleRule(**kwargs)


def test_the_rate_comes_from_b_first_and_skips_failed_measurements() -> None:
    testbed: dict[str, Any] = {
        "E@0.3": {"prefill": {"tokens_per_s": 9_000.0}},
        "B@0.3": {"error": "TimeoutError: server gone"},
        "G@0.3": {"prefill": {"tokens_per_s": None}},
    }
    assert measured_prefill_rate(testbed) == 9_000.0
    testbed["B@0.3"] = {"prefill": {"tokens_per_s": 4_000.0}}
    assert measured_prefill_rate(testbed) == 4_000.0
    assert measured_prefill_rate({}) is None


def test_a_gap_scale_needs_the_testbed() -> None:
    with pytest.raises(ConfigError, match="measure_testbed"):
        BenchConfig(trace_path="t.jsonl", gap_scale=GapScaleRule(), measure_testbed=False)


def test_the_runner_rescales_once_after_the_first_measurement() -> None:
    """The first stage's measurement sets the scale, the workload and the gap warm-up
    are rebuilt with it, and later stages keep it (8 of the 12 trajectories replayed: the
    other 4 train the gap model)."""
    trace = load_trace(demo_trace_path())
    scaling = replace(SCALING, max_trajectories=8)
    cfg = BenchConfig(trace_path=demo_trace_path(), scaling=scaling, gap_scale=GapScaleRule())
    workload = make_workload(trace, scaling)
    run = _runner._Setup(
        cfg=cfg,
        trace=trace,
        workload=workload,
        synth=cast(Any, None),
        platform=cast(Any, None),
        model_dir=None,
        emit=lambda kind, data: None,
        warmup=make_warmup(trace, workload, cfg.warm_gaps),
    )
    record: dict[str, dict[str, Any]] = {"testbed": {"B@0.3": {"prefill": {"tokens_per_s": 35e3}}}}
    _runner._rescale_gaps(run, record)
    scale = record["gap_scale"]["time_scale"]
    assert 0.05 < scale < 0.3 and run.cfg.scaling.time_scale == scale
    before = [t.tool_gap_s for tr in workload.trajectories for t in tr.turns]
    after = [t.tool_gap_s for tr in run.workload.trajectories for t in tr.turns]
    for b, a in zip(before, after, strict=True):
        assert (a is None and b is None) or a == pytest.approx(b / 0.3 * scale)
    old = make_warmup(trace, workload, cfg.warm_gaps).samples
    assert old and [g for _, g, _ in run.warmup.samples] == pytest.approx(
        [g / 0.3 * scale for _, g, _ in old]
    )
    record["testbed"]["B@0.5"] = {"prefill": {"tokens_per_s": 1e3}}
    _runner._rescale_gaps(run, record)  # a later pool's servers change nothing
    assert run.cfg.scaling.time_scale == scale


def test_the_demo_scales_its_gaps_from_the_machine() -> None:
    cfg = demo_config("out", 1)
    assert cfg.gap_scale is not None and cfg.gap_scale.max_scale == cfg.scaling.time_scale


def _bench_args(*extra: str) -> Any:
    import argparse

    from agentkv.bench import _cli

    parser = argparse.ArgumentParser()
    _cli.add_arguments(parser)
    return parser.parse_args(["--trace", demo_trace_path(), *extra])


def test_the_bench_flag_caps_the_scale_at_time_scale() -> None:
    """``--time-scale-from-prefill`` keeps ``--time-scale`` as the cap (gaps never grow)."""
    from agentkv.bench._cli import config_from_args

    cfg = cast(
        BenchConfig,
        config_from_args(_bench_args("--time-scale", "0.2", "--time-scale-from-prefill")),
    )
    assert cfg.gap_scale is not None
    assert cfg.gap_scale.max_scale == 0.2 and cfg.gap_scale.min_scale == 0.05
    tiny = cast(
        BenchConfig,
        config_from_args(_bench_args("--time-scale", "0.01", "--time-scale-from-prefill")),
    )
    assert tiny.gap_scale is not None and tiny.gap_scale.min_scale == 0.01
    assert cast(BenchConfig, config_from_args(_bench_args())).gap_scale is None
    with pytest.raises(ConfigError, match="measure_testbed"):
        config_from_args(_bench_args("--time-scale-from-prefill", "--no-testbed"))


def test_a_live_run_refuses_the_flag() -> None:
    from agentkv.bench._cli import live_config_from_args

    with pytest.raises(ConfigError, match="live run"):
        live_config_from_args(_bench_args("--time-scale-from-prefill"))
