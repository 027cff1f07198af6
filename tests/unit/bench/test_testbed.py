"""The testbed-cost measurement: pure parts and the calibration against a canned server
(no vLLM needed)."""

from __future__ import annotations

import os
from typing import Any

import httpx
import pytest

from agentkv.bench.report._testbedtable import render_testbed_lines
from agentkv.bench.testbed._costs import (
    HISTOGRAMS,
    CallTiming,
    ProcessSampler,
    classify_processes,
    compute_decode_step_s,
    compute_histogram_means,
    compute_prefill_tokens_per_s,
    compute_turn_split,
    engine_decode_step_s,
    parse_proc_stat,
)
from agentkv.bench.testbed._probe import CalibrationPlan
from tests.support.bench_fakes import canned_completions


def test_histogram_means_are_taken_over_the_requests_between_scrapes() -> None:
    """Mean = delta sum / delta count; a histogram with no new request gives None."""
    name = HISTOGRAMS["ttft_s"]
    before = {name + "_sum": 1.0, name + "_count": 2.0}
    after = {name + "_sum": 1.6, name + "_count": 5.0}
    means = compute_histogram_means(before, after)
    assert means["ttft_s"] == pytest.approx(0.2)
    assert means["queue_s"] is None


def test_turn_split_adds_up_to_the_client_ttft() -> None:
    """Engine = queue + first step; API server = the rest of vLLM's TTFT; client = the rest."""
    split = compute_turn_split(0.050, {"ttft_s": 0.030, "queue_s": 0.001, "prefill_s": 0.020})
    assert split is not None
    assert split["engine_s"] == pytest.approx(0.021)
    assert split["api_server_s"] == pytest.approx(0.009)
    assert split["client_s"] == pytest.approx(0.020)
    assert sum(split.values()) == pytest.approx(0.050)
    assert compute_turn_split(0.05, {"ttft_s": None}) is None
    # separate clocks never give a negative share
    assert compute_turn_split(0.01, {"ttft_s": 0.02, "queue_s": 0.0, "prefill_s": 0.03}) == {
        "client_s": 0.0,
        "api_server_s": 0.0,
        "engine_s": 0.03,
    }


def test_prefill_rate_is_marginal_and_refuses_nonsense() -> None:
    """Tokens/s from the difference of two prompts; equal or inverted timings give None."""
    assert compute_prefill_tokens_per_s(512, 0.2, 2048, 0.8) == pytest.approx(1536 / 0.6)
    assert compute_prefill_tokens_per_s(512, 0.8, 2048, 0.8) is None
    assert compute_prefill_tokens_per_s(2048, 0.2, 512, 0.8) is None


def test_decode_step_is_the_median_per_token_time_after_the_first() -> None:
    """(e2e - ttft) / (k - 1); single-token or TTFT-less calls are ignored."""
    calls = [
        CallTiming(0.1, 0.1 + 31 * 0.008, 32),
        CallTiming(0.1, 0.1 + 31 * 0.010, 32),
        CallTiming(0.1, 0.1 + 31 * 0.030, 32),
        CallTiming(None, 1.0, 32),
        CallTiming(0.1, 0.2, 1),
    ]
    assert compute_decode_step_s(calls) == pytest.approx(0.010)
    assert compute_decode_step_s([CallTiming(0.1, 0.2, 1)]) is None


def test_decode_step_prefers_the_engines_own_inter_token_latency() -> None:
    """vLLM's ITL over the calls is the step when it reported one; the client's figure,
    which an API server falling behind the engine drives to about 0 (the first chunk
    arrives with the whole answer), is the fallback; nothing measurable gives None."""
    burst = [CallTiming(0.05, 0.0506, 32), CallTiming(0.05, 0.0505, 32)]  # all in one chunk
    assert engine_decode_step_s(0.0024, burst) == (0.0024, "server")
    step, source = engine_decode_step_s(None, burst)
    assert source == "client" and step == pytest.approx(0.55e-3 / 31)
    assert engine_decode_step_s(0.0, [CallTiming(0.1, 0.2, 1)]) == (None, None)


def test_proc_stat_parsing_survives_odd_process_names() -> None:
    """comm may hold spaces and parentheses; ppid and utime+stime follow the last ')'."""
    line = "4242 (VLLM::Engine (x) y) S 4200 4242 4200 0 -1 4194560 1 2 3 4 150 25 0 0 20 0 16"
    assert parse_proc_stat(line) == ("VLLM::Engine (x) y", 4200, 175)


def test_processes_are_classified_under_the_server_root() -> None:
    """API server = root; engine core and worker found among descendants only."""
    rows = [
        (100, 1, "python3"),
        (101, 100, "python3"),  # resource tracker
        (102, 100, "VLLM::EngineCor"),
        (103, 102, "VLLM::Worker"),
        (200, 1, "VLLM::Worker"),  # another server's worker
    ]
    assert classify_processes(rows, 100) == {
        "api_server": 100,
        "engine_core": 102,
        "worker": 103,
    }


def test_process_delta_divides_by_turns_and_keeps_known_roles() -> None:
    before = {"client": (1.0, 0.5), "worker": (10.0, 1.0), "other": (0.0, 0.0)}
    after = {"client": (3.0, 0.7), "worker": (30.0, 5.0), "other": (9.0, 9.0)}
    delta = ProcessSampler.delta(before, after, per=4)
    assert delta == {
        "cpu_s": {"client": 0.5, "worker": 5.0},
        "runqueue_wait_s": {"client": pytest.approx(0.05), "worker": 1.0},
    }
    assert ProcessSampler.delta(None, after) is None


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_sampler_reads_this_process() -> None:
    """Pointed at this process as a 'server', it samples CPU time that only grows."""
    sampler = ProcessSampler(os.getpid())
    first = sampler.sample()
    sum(i * i for i in range(200_000))
    second = sampler.sample()
    assert first is not None and second is not None
    assert second["client"][0] >= first["client"][0]
    assert set(first) >= {"client", "api_server"}


def test_plan_sizes_fit_the_server() -> None:
    """Cached prompts end one token past whole blocks and leave room for the decode."""
    plan = CalibrationPlan(block_size=32, max_model_len=480, concurrency=4, context_tokens=7000)
    assert plan.cached_tokens(256) == 257
    long = plan.cached_tokens(plan.context_tokens)
    assert (long - 1) % 32 == 0 and long + plan.decode_tokens <= 480
    short, longer = plan.fresh_lengths()
    assert short < longer <= 478


def test_report_lines_show_each_server_or_why_not() -> None:
    testbed: dict[str, Any] = {
        "B@0.5": {
            "fixed_turn": {
                "client_ttft_s_p50": 0.040,
                "split": {"client_s": 0.01, "api_server_s": 0.008, "engine_s": 0.022},
                "cpu_s_per_turn": {"client": 0.004, "api_server": 0.006},
            },
            "cached_long_turn": {"client_ttft_s_p50": 0.12, "prompt_tokens": 7681},
            "prefill": {"tokens_per_s": 2500.0, "at_context_tokens_per_s": 900.0},
            "decode": {
                "short_batch_1_step_s": 0.008,
                "batch_1_step_s": 0.03,
                "batch_n_step_s": 0.12,
                "batch_n": 12,
            },
            "load_avg_1m": [1.5, 2.0],
        },
        "E@0.5": {"error": "ReadTimeout: timed out"},
    }
    lines = render_testbed_lines(testbed)
    assert (
        "| B@0.5 | 40 (10 / 8 / 22) | 120 at 7681 tokens | 2,500 / 900 | 8 / 30 / 120 (N=12)"
        in lines[2]
    )
    assert "1.5 → 2.0" in lines[2]
    assert "not measured: ReadTimeout" in lines[3]


# --- against a canned server ----------------------------------------------------------
async def test_calibration_reports_every_figure_against_a_canned_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """measure_testbed runs its series end to end; without server histograms the split is
    None but client timings, prefill and decode figures are filled."""
    import openai

    from agentkv.bench.testbed import _probe

    seen: list[dict[str, Any]] = []
    transport = canned_completions(seen)
    real = openai.AsyncOpenAI

    def fake_client(*args: Any, **kwargs: Any) -> Any:
        kwargs["http_client"] = httpx.AsyncClient(transport=transport)
        return real(*args, **kwargs)

    monkeypatch.setattr(openai, "AsyncOpenAI", fake_client)
    monkeypatch.setattr(_probe, "get_vllm_metrics_raw", lambda url: {})
    plan = CalibrationPlan(
        block_size=32, max_model_len=480, concurrency=3, context_tokens=300, decode_tokens=4
    )
    out = await _probe.measure_testbed("http://stub/v1", "m", plan)
    assert "error" not in out, out
    assert out["fixed_turn"]["prompt_tokens"] == 257
    assert out["fixed_turn"]["client_ttft_s_p50"] is not None
    assert out["fixed_turn"]["split"] is None  # no histograms from the stub
    assert out["decode"]["batch_n"] == 3
    assert out["decode"]["batch_1_step_s"] is not None
    assert out["decode"]["step_source"] == "client"  # the stub has no ITL histogram
    assert out["decode"]["client_step_s"][1] == out["decode"]["batch_1_step_s"]
    assert out["prefill"]["tokens"][0] < out["prefill"]["tokens"][1]
    assert out["prefill"]["at_context_new_tokens"] > 0
    assert out["decode"]["context_tokens"] == out["cached_long_turn"]["prompt_tokens"]
    # 2 warm-ups, 8 fixed, 3 long, 2+2 fresh, 2 at context, 2+2 at batch 1, 3 at batch 3
    assert len(seen) == 2 + 8 + 3 + 4 + 2 + 4 + 3
