"""Pure logic of the vLLM side: profile argv, settings, hint parsing, control input.

The lease, pressure, admission and priority decisions are tested in tests/unit/residency/test_core.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentkv._errors import ConfigError, VLLMNotInstalledError
from agentkv.protocol._hints import decode_hint
from agentkv.residency import PolicySettings
from agentkv.residency._strategies import make_strategies
from agentkv.vllm import ServeProfile
from agentkv.vllm._control import (
    MAX_EVENTS_PER_BATCH,
    ControlInputError,
    is_authorized,
    validate_events_body,
)
from agentkv.vllm._hints import has_lower_tier, intent_of
from agentkv.vllm._settings import SchedSettings


def _cpu(**kw: object) -> ServeProfile:
    return ServeProfile(model="/m", port=8000, platform="cpu", **kw)  # type: ignore[arg-type]


# -- profile -----------------------------------------------------------------------------
def test_profile_argv_snapshot_cpu_small_pool() -> None:
    p = _cpu(block_size=32, num_gpu_blocks_override=64, enforce_eager=True)
    assert p.to_argv() == [
        "--model", "/m", "--host", "127.0.0.1", "--port", "8000", "--dtype", "auto",
        "--max-model-len", "2016", "--block-size", "32", "--enable-prefix-caching",
        "--num-gpu-blocks-override", "64", "--enforce-eager", "--seed", "0",
        "--enable-prompt-tokens-details", "--enable-request-id-headers",
        "--scheduling-policy", "priority",
        "--scheduler-cls", "agentkv.vllm._scheduler.AgentKVScheduler",
        "--middleware", "agentkv.vllm._control.control_middleware",
        "--middleware", "agentkv.vllm._saltgate.SaltGateMiddleware",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip


def test_profile_stock_arm_has_no_plugin_and_fcfs() -> None:
    argv = _cpu(agentkv_plugin=False, enable_prefix_caching=False).to_argv()
    assert "--scheduler-cls" not in argv and "--middleware" not in argv
    assert "--no-enable-prefix-caching" in argv
    assert argv[argv.index("--scheduling-policy") + 1] == "fcfs"
    assert not any(k.startswith("AGENTKV_SCHED_") for k in _cpu(agentkv_plugin=False).env())


def test_profile_lifecycle_only_arm_keeps_fcfs_and_tells_engine() -> None:
    p = _cpu(program_scheduling=False)
    argv = p.to_argv()
    assert argv[argv.index("--scheduling-policy") + 1] == "fcfs"
    env = p.env()
    assert env["AGENTKV_SCHED_LIFECYCLE"] == "1" and env["AGENTKV_SCHED_PROGRAM"] == "0"


def test_profile_fp8_and_gpu_offload() -> None:
    assert "fp8" in _cpu(kv_cache_dtype="fp8").to_argv()
    gpu = ServeProfile(model="/m", port=1, platform="cuda", kv_offload_size_gib=8)
    argv = gpu.to_argv()
    assert argv[argv.index("--kv-offloading-size") + 1] == "8"
    assert argv[argv.index("--kv-offloading-backend") + 1] == "native"


def test_profile_refuses_offload_on_cpu_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match="remove kv_offload_size_gib"):
        _cpu(kv_offload_size_gib=4)


def test_profile_pool_smaller_than_max_model_len_says_what_to_change() -> None:
    with pytest.raises(ConfigError, match="at least 129 or lower max_model_len to 2016"):
        _cpu(block_size=32, num_gpu_blocks_override=64, max_model_len=4096)


def test_profile_block_size_must_suit_cpu_kernels() -> None:
    with pytest.raises(ConfigError, match="multiple of 32"):
        _cpu(block_size=48)


def test_profile_extra_args_win_over_profile_values() -> None:
    argv = _cpu(
        block_size=32, extra_args=["--block-size", "64", "--no-enable-prefix-caching"]
    ).to_argv()
    assert argv.count("--block-size") == 1 and argv[argv.index("--block-size") + 1] == "64"
    assert "--enable-prefix-caching" not in argv and "--no-enable-prefix-caching" in argv


def test_profile_env_carries_kv_space_and_api_key_off_argv() -> None:
    p = _cpu(kv_cache_memory_gib=1.5, api_key="sekret", extra_env={"X": "1"})
    env = p.env()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and env["VLLM_API_KEY"] == "sekret"
    assert env["X"] == "1" and "sekret" not in p.to_argv()


def test_profile_without_port_or_model_says_what_to_do() -> None:
    with pytest.raises(ConfigError, match="port"):
        ServeProfile(model="/m", platform="cpu").to_argv()
    with pytest.raises(ConfigError, match="model"):
        ServeProfile(port=1, platform="cpu").to_argv()


def test_plugin_features_need_the_plugin() -> None:
    with pytest.raises(ConfigError, match="agentkv_plugin=True"):
        _cpu(agentkv_plugin=False, lifecycle_hints=True)


def test_stock_profile_resolves_for_the_platform_without_complaint() -> None:
    """A plugin-less profile stays valid after the platform is filled in."""
    profile = ServeProfile(model="m", port=8000, agentkv_plugin=False).resolve()
    assert profile.platform is not None
    assert "--scheduler-cls" not in profile.to_argv()


_EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
_XEON = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512bw\n"
_SAPPHIRE = "processor\t: 0\nflags\t\t: fpu avx2 amx_tile amx_bf16\n"


def test_cpu_fp8_kv_needs_avx512_or_amx() -> None:
    """vLLM's CPU attention only keeps FP8 KV on x86 with AVX-512 or AMX."""
    from agentkv.vllm._platform import cpu_fp8_kv_unsupported_reason as why

    assert why(_XEON, "x86_64") is None
    assert why(_SAPPHIRE, "x86_64") is None
    assert "neither" in (why(_EPYC, "x86_64") or "")
    assert "aarch64" in (why(_XEON, "aarch64") or "")
    assert why("", "x86_64") is not None  # unreadable cpuinfo: not claimed


def test_profile_refuses_fp8_where_the_cpu_cannot_keep_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resolving an FP8 profile on such a CPU fails at set-up, naming the fix."""
    from agentkv.vllm import _platform

    info = _platform.PlatformInfo(
        name="cpu",
        vllm_installed=True,
        vllm_distribution="vllm-cpu",
        vllm_version="0.32.0",
        default_block_size=128,
        offload_supported=False,
        offload_reason="no lower tier",
        fp8_kv_supported=False,
        fp8_kv_reason="FP8 KV cache on the CPU build needs x86 with AVX-512 or AMX",
    )
    monkeypatch.setattr(_platform, "detect_platform", lambda: info)
    with pytest.raises(ConfigError, match="kv_cache_dtype='auto'"):
        ServeProfile(model="m", port=8000, kv_cache_dtype="fp8").resolve()
    assert ServeProfile(model="m", port=8000).resolve().platform == "cpu"


def test_serve_without_vllm_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    import agentkv
    from agentkv.vllm import _platform

    monkeypatch.setattr(_platform, "vllm_distribution", lambda: None)
    with pytest.raises(VLLMNotInstalledError, match=r"pip install 'agentkv-cache\[cpu\]'"):
        agentkv.serve()


def test_settings_env_round_trip() -> None:
    s = SchedSettings(
        lifecycle=False, max_ttl_ms=1234, max_retained_fraction=0.25, offload_reason="x y"
    )
    assert SchedSettings.from_env(s.to_env()) == s
    assert SchedSettings.from_env({"AGENTKV_SCHED_MAX_TTL_MS": "oops"}).max_ttl_ms == 600_000
    p = SchedSettings(retention="predicted", admission=True, aging_s=3.5)
    assert SchedSettings.from_env(p.to_env()) == p
    assert SchedSettings.from_env({"AGENTKV_SCHED_RETENTION": "lru"}).retention == "predicted"
    assert SchedSettings().admission and SchedSettings().max_retained_fraction == 0.9


def test_serve_exposes_the_lease_policy_and_leaves_unset_choices_to_the_profile() -> None:
    import argparse

    from agentkv.vllm import _cli

    parser = argparse.ArgumentParser()
    _cli.add_arguments(parser)
    argv = ["--retention", "predicted", "--no-admission", "--max-retained-fraction", "0.8",
            "--min-running", "3", "--aging-s", "4.5"]  # fmt: skip
    _, opts = _cli._options(parser.parse_args(argv))
    got = ServeProfile(**opts, platform="cpu").sched_settings()
    assert (got.retention, got.admission, got.max_retained_fraction) == ("predicted", False, 0.8)
    assert (got.min_running, got.aging_s) == (3, 4.5)
    _, unset = _cli._options(parser.parse_args([]))
    default = ServeProfile(platform="cpu").sched_settings()
    assert ServeProfile(**unset, platform="cpu").sched_settings() == default


def test_cli_splits_vllm_args_after_double_dash(capsys: pytest.CaptureFixture[str]) -> None:
    from agentkv.cli import main

    assert main(["serve", "/some/model", "--port", "9", "--print-argv", "--", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("--seed 7") and out.count("--seed") == 1
    assert "--model /some/model" in out


# -- hints: the codec's own tests are tests/unit/protocol/ ----------------------------------
def test_a_rejected_hint_leaves_the_request_unhinted() -> None:
    h = decode_hint({"agentkv_trajectoryId": "t", "agentkv_action": "explode"})
    assert h is not None and h.rejected and h.action == "default" and not h.trajectory_id


# -- control input -----------------------------------------------------------------------
def test_events_body_validation() -> None:
    good, bad = validate_events_body(json.dumps({"events": [
        {"trajectoryId": "t", "event": "tool_started", "emittedAtMs": 1,
         "advice": {"action": "retain", "ttlMs": 100}},
        {"trajectoryId": "", "event": "tool_started"},
        {"trajectoryId": "t", "event": "nope"},
        {"trajectoryId": "t", "event": "tool_started", "advice": {"action": "retain", "ttlMs": -1}},
        "str",
    ]}).encode())  # fmt: skip
    assert [g["action"] for g in good] == ["retain"]
    assert [r["index"] for r in bad] == [1, 2, 3, 4]


def test_events_carry_the_advice_gap_forecast() -> None:
    advice = {"action": "retain", "ttlMs": 100, "predictedGapMs": 1500.5,
              "predictedGapP90Ms": 4000, "predictedGapP99Ms": 9000}  # fmt: skip
    good, bad = validate_events_body(json.dumps({"events": [
        {"trajectoryId": "t", "event": "tool_started", "advice": advice},
        {"trajectoryId": "t", "event": "tool_started",
         "advice": {"action": "retain", "predictedGapMs": -3}},
        {"trajectoryId": "t", "event": "tool_started",
         "advice": {"action": "retain", "predictedGapP90Ms": "x"}},
    ]}).encode())  # fmt: skip
    assert [r["index"] for r in bad] == [1, 2]
    assert (good[0]["gap_ms"], good[0]["gap_p90_ms"], good[0]["gap_p99_ms"]) == (
        1500.5, 4000.0, 9000.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"not json", 400),
        (b"[]", 400),
        (b'{"events": 3}', 400),
        (json.dumps({"events": [{}] * (MAX_EVENTS_PER_BATCH + 1)}).encode(), 413),
        (b"x" * (2 << 20), 413),
    ],
)
def test_events_body_rejected_whole(body: bytes, status: int) -> None:
    with pytest.raises(ControlInputError) as info:
        validate_events_body(body)
    assert info.value.status == status


def test_control_route_requires_the_api_key_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)

    def req(keys: list[str] | None, header: str | None) -> SimpleNamespace:
        app = SimpleNamespace(state=SimpleNamespace(args=SimpleNamespace(api_key=keys)))
        return SimpleNamespace(app=app, headers={"authorization": header} if header else {})

    assert is_authorized(req(None, None))
    assert not is_authorized(req(["k"], None))
    assert not is_authorized(req(["k"], "Bearer wrong"))
    assert is_authorized(req(["k"], "Bearer k"))
    monkeypatch.setenv("VLLM_API_KEY", "envkey")
    assert not is_authorized(req(None, None)) and is_authorized(req(None, "bearer envkey"))


def test_prepare_profile_keeps_plugin_less_choices_and_sizes_the_tiny_model_kv(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agentkv.vllm import _launch

    monkeypatch.setattr(_launch, "ensure_embedded_model", lambda name: f"/models/{name}")
    stock = _launch.prepare_profile(agentkv_plugin=False, platform="cpu")
    assert stock.model == "/models/agentkv-tiny" and stock.port
    assert stock.served_model_name == "agentkv-tiny"
    assert "--scheduler-cls" not in stock.to_argv()
    assert stock.kv_cache_memory_gib == _launch.TINY_MODEL_KV_GIB
    assert stock.env()["VLLM_CPU_KVCACHE_SPACE"] == "2"
    sized = _launch.prepare_profile(platform="cpu", kv_cache_memory_gib=1)
    assert sized.kv_cache_memory_gib == 1


def test_prepare_profile_resolves_the_embedded_real_model_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``model="smollm2"`` becomes its checkpoint, served as ``smollm2`` with the embedded
    models' KV size; any other model is left to vLLM as given."""
    from agentkv.vllm import _launch

    monkeypatch.setattr(_launch, "ensure_embedded_model", lambda name: f"/models/{name}")
    real = _launch.prepare_profile("smollm2", platform="cpu")
    assert (real.model, real.served_model_name) == ("/models/smollm2", "smollm2")
    assert real.kv_cache_memory_gib == _launch.TINY_MODEL_KV_GIB
    named = _launch.prepare_profile("smollm2", platform="cpu", served_model_name="small")
    assert named.served_model_name == "small"
    other = _launch.prepare_profile("HuggingFaceTB/SmolLM2-135M-Instruct", platform="cpu")
    assert other.model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert other.served_model_name is None and other.kv_cache_memory_gib is None


# -- what a finished request's blocks become ----------------------------------------------
@pytest.mark.parametrize(
    ("action", "reason", "retention", "tier", "pending", "expected"),
    [
        ("release", "terminal_state", "predicted", False, False, "release"),
        ("release", "capacity_pressure", "predicted", False, False, "candidate"),
        ("release", "", "predicted", False, False, "release"),
        ("release", "capacity_pressure", "hint", False, False, "release"),
        ("retain", "short_tool_gap", "predicted", False, False, "candidate"),
        ("default", "insufficient_evidence", "predicted", True, False, "candidate"),
        ("offload", "capacity_pressure", "hint", True, False, "offload"),
        ("offload", "capacity_pressure", "hint", False, False, "none"),
        ("retain", "short_tool_gap", "hint", False, False, "lease"),
        ("default", "insufficient_evidence", "hint", False, True, "lease"),
        ("default", "insufficient_evidence", "hint", False, False, "none"),
        ("prefetch", "next_step_known", "hint", False, False, "none"),
    ],
)
def test_finish_decision(
    action: str, reason: str, retention: str, tier: bool, pending: bool, expected: str
) -> None:
    xargs = {"agentkv_trajectoryId": "t", "agentkv_action": action}
    if reason:  # "": no reason sent (an empty one is malformed)
        xargs["agentkv_reason"] = reason
    hint = decode_hint(xargs)
    assert hint is not None and not hint.rejected
    sizing = make_strategies(PolicySettings(retention=retention)).sizing  # type: ignore[arg-type]
    got = sizing.finish_action(intent_of(hint), lower_tier=tier, pending_retain=pending)
    assert got == expected


def test_lower_tier_is_an_offloading_connector_not_any_kv_transfer() -> None:
    def cfg(name: str, **extra: object) -> SimpleNamespace:
        return SimpleNamespace(kv_connector=name, kv_connector_extra_config=extra)

    assert not has_lower_tier(None)
    assert has_lower_tier(cfg("OffloadingConnector"))
    assert has_lower_tier(cfg("LMCacheMPConnector"))
    assert not has_lower_tier(cfg("NixlConnector"))  # disaggregated prefill, no tier
    multi = cfg("MultiConnector", connectors=[{"kv_connector": "NixlConnector"},
                                              {"kv_connector": "OffloadingConnector"}])  # fmt: skip
    assert has_lower_tier(multi)


# -- admission's step timing ---------------------------------------------------------------
def test_the_plugin_learns_the_prefill_cost_from_the_engine_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each step's prompt tokens (not its decodes), in pool blocks of every KV-cache group,
    against its wall time from ``schedule()`` to its output, or from the previous output
    when the step was scheduled while another ran (async scheduling)."""
    import agentkv.vllm._admission as admission
    from agentkv.residency import PolicyCore

    clock = [100.0]
    monkeypatch.setattr(admission, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    core = PolicyCore(PolicySettings(), 100)
    plugin = SimpleNamespace(
        scheduler=SimpleNamespace(block_size=16),
        port=SimpleNamespace(blocks_per_hash=2),
        ctl=SimpleNamespace(core=core),
    )
    gate = admission.AdmissionGate(plugin)  # type: ignore[arg-type]

    def out(**tokens: int) -> SimpleNamespace:
        return SimpleNamespace(num_scheduled_tokens=tokens)

    one, two, three = out(a=64, b=1), out(a=32, b=1), out(a=1, b=1)
    gate.mark_step(one)  # 64 prompt tokens: 4 blocks in each of 2 groups
    clock[0] = 100.5
    gate.time_step(one)
    assert core.prefill_s_per_block == pytest.approx(0.5 / 8)
    clock[0] = 100.6
    gate.mark_step(two)
    clock[0] = 100.7
    gate.mark_step(three)  # decodes only: teaches nothing
    clock[0] = 101.0
    gate.time_step(two)  # 0.4 s since it was scheduled
    clock[0] = 101.2
    gate.time_step(three)
    keep = 1.0 - PolicyCore.STEP_ALPHA
    want = (keep * 0.5 + 0.4) / (keep * 8 + 4)
    assert core.prefill_s_per_block == pytest.approx(want)
    assert not gate.steps


def test_free_ports_are_drawn_below_the_kernels_ephemeral_range(tmp_path: Path) -> None:
    from agentkv.vllm import _launch

    low = _launch._ephemeral_low()
    ports = {_launch.find_free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in ports), (low, ports)
    assert len(ports) > 1  # drawn at random, not one fixed port
    bad = tmp_path / "range"
    bad.write_text("not a range\n")
    assert _launch._ephemeral_low(str(bad)) == 32768
    assert _launch._ephemeral_low(str(tmp_path / "missing")) == 32768


def test_free_port_falls_back_to_the_kernels_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentkv.vllm import _launch

    monkeypatch.setattr(_launch, "_bindable", lambda host, port: False)
    port = _launch.find_free_port("0.0.0.0")
    assert 0 < port < 65536


def test_smollm2_is_served_in_float32_on_cpu_unless_a_dtype_is_given() -> None:
    """bfloat16 (vLLM's CPU default) turns SmolLM2's answers into noise: the profile of the
    embedded model asks for float32 on CPU, and an explicit dtype still wins."""
    from agentkv.vllm import _launch
    from tests.support.requires import require_smollm2_wheel

    require_smollm2_wheel()
    assert _launch.prepare_profile("smollm2", platform="cpu").dtype == "float32"
    assert _launch.prepare_profile("smollm2", platform="cpu", dtype="bfloat16").dtype == "bfloat16"
    assert _launch.prepare_profile(None, platform="cpu").dtype == "auto"
