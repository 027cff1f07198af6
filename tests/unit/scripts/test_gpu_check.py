"""scripts/gpu_check.py: the GPU check's parsing, verdicts and table (pure parts)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gc = _load()


def test_metrics_are_summed_over_label_sets() -> None:
    text = (
        "# HELP vllm:external_prefix_cache_hits_total x\n"
        'vllm:external_prefix_cache_hits_total{engine="0"} 32.0\n'
        'vllm:external_prefix_cache_hits_total{engine="1"} 64.0\n'
        "vllm:kv_offload_load_bytes_total 1e6\n"
    )
    m = gc.parse_metrics(text)
    assert m[gc.EXTERNAL_HITS] == 96.0 and m[gc.LOAD_BYTES] == 1e6


def test_the_pressure_check_accepts_a_trim_and_fails_on_a_preemption() -> None:
    assert gc.judge_pressure({"leases_trimmed": 1}, 0)
    assert gc.judge_pressure({"leases_pressure_released": 1}, 0)
    assert not gc.judge_pressure({"leases_trimmed": 1}, 1)  # something was preempted
    assert not gc.judge_pressure({}, 0)  # no lease gave way


def test_retention_with_the_tier_off_must_not_come_from_a_tier() -> None:
    assert gc.judge_retain(600, 512, 0)
    assert not gc.judge_retain(600, 512, 32)  # served by a lower tier: not the plugin
    assert not gc.judge_retain(100, 512, 0)
    assert gc.judge_release(4, 0, 512) and not gc.judge_release(0, 0, 512)


def test_the_tier_check_needs_vllms_counters_and_the_plugins() -> None:
    used = {gc.EXTERNAL_HITS: 512, gc.LOAD_BYTES: 1e6}
    assert gc.judge_tier(used, {"tier_hit_tokens": 512})
    assert not gc.judge_tier(used, {"tier_hit_tokens": None})
    assert not gc.judge_tier({gc.EXTERNAL_HITS: 512}, {"tier_hit_tokens": 512})


def test_verdicts_name_what_failed(capsys: object) -> None:
    v = gc.Verdicts()
    v.check("a", True, {})
    v.check("b", False, {"x": 1})
    assert v.failed == ["b"]


def test_the_bench_table_has_one_row_per_arm_and_says_what_did_not_run() -> None:
    results = {"arms": {
        "B": {"jct_mean_s": 10.0, "jct_p95_s": 20.0, "prefix_reuse_ratio": 0.5, "preemptions": 1,
              "tier": {"tier_hit_tokens": None, "load_bytes": None}},
        "D": {"jct_mean_s": 8.0, "jct_p95_s": 15.0, "prefix_reuse_ratio": 0.9, "preemptions": 0,
              "tier": {"tier_hit_tokens": 4096, "load_bytes": 2e9, "load_bytes_per_s": 1e10}},
    }}  # fmt: skip
    table = gc.bench_table(results).splitlines()
    assert len(table) == 2 + 5
    assert "| D | 8.00 | 15.00 | 0.900 | 0.0 | 4096 | 2.00 | 10.00 |" in table
    assert table[-1].startswith("| L | not run")


def test_the_shell_wrapper_parses() -> None:
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")]).returncode == 0
