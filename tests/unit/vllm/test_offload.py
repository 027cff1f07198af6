"""The CPU offload tier in the launch profile: on by default on GPUs, sized by rule."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from agentkv import ConfigError, ServeProfile
from agentkv.vllm._launch import prepare_profile
from agentkv.vllm._offload import (
    MIN_GIB,
    compute_offload_size,
    host_available_bytes,
    size_offload_tier,
)

_GIB = 2**30


def _model(tmp_path: Path) -> Path:
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
           "head_dim": 64, "torch_dtype": "bfloat16", "max_position_embeddings": 8192}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_the_rule_is_paused_times_p90_bytes_times_headroom_bounded_by_the_host() -> None:
    s = compute_offload_size(paused_trajectories=16, context_tokens_p90=8192,
                             kv_bytes_per_token=131072, host_available_bytes=None, headroom=1.25)  # fmt: skip
    assert s.wanted_bytes == int(16 * 8192 * 131072 * 1.25) and s.size_gib == 20.0
    assert not s.bounded_by_host
    small = compute_offload_size(paused_trajectories=16, context_tokens_p90=8192,
                                 kv_bytes_per_token=131072, host_available_bytes=8 * _GIB)  # fmt: skip
    assert small.size_gib == 4.0 and small.bounded_by_host and "bounded by host" in small.describe()
    tiny = compute_offload_size(paused_trajectories=1, context_tokens_p90=10,
                                kv_bytes_per_token=10, host_available_bytes=None)  # fmt: skip
    assert tiny.size_gib == MIN_GIB


def test_sizing_reads_the_model_config_and_the_profile_inputs(tmp_path: Path) -> None:
    model = _model(tmp_path)  # 2 x 4 x 2 x 64 x 2 = 2048 bytes per token
    s = size_offload_tier(str(model), max_num_seqs=32, host_bytes=1 << 50)
    assert s is not None and s.kv_bytes_per_token == 2048
    assert (s.paused_trajectories, s.context_tokens_p90) == (32, 8192)
    s = size_offload_tier(str(model), trajectories=4, context_tokens=1000, kv_cache_dtype="fp8",
                          host_bytes=1 << 50)  # fmt: skip
    assert s is not None and (s.paused_trajectories, s.kv_bytes_per_token) == (4, 1024)
    assert size_offload_tier(str(tmp_path / "missing")) is None


def test_gpu_profiles_get_the_tier_by_default_and_can_turn_it_off(tmp_path: Path) -> None:
    model = _model(tmp_path)
    p = prepare_profile(str(model), platform="cuda", port=1, max_num_seqs=256)
    assert p.kv_offload_size_gib is not None and p.kv_offload_size_gib >= MIN_GIB
    argv = p.to_argv()
    assert argv[argv.index("--kv-offloading-backend") + 1] == "native"
    off = prepare_profile(str(model), platform="cuda", port=1, kv_offload=False)
    assert "--kv-offloading-size" not in off.to_argv()
    assert "kv_offload=False" in off.sched_settings().offload_reason
    cpu = prepare_profile(str(model), platform="cpu", port=1)
    assert "--kv-offloading-size" not in cpu.to_argv() and cpu.kv_offload_size_gib is None


def test_lmcache_and_contradictory_offload_settings_are_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigError, match=r"only 'native'.*LMCache server"):
        ServeProfile(model="/m", port=1, platform="cuda", kv_offload_backend="lmcache")
    with pytest.raises(ConfigError, match="kv_offload=False"):
        ServeProfile(model="/m", port=1, platform="cuda", kv_offload=False, kv_offload_size_gib=4)


def test_host_memory_is_read_from_meminfo(tmp_path: Path) -> None:
    f = tmp_path / "meminfo"
    f.write_text("MemTotal: 100 kB\nMemAvailable: 2048 kB\n")
    assert host_available_bytes(str(f)) == 2048 * 1024
    assert host_available_bytes(str(tmp_path / "none")) is None


# -- CPU servers: the KV space from the pool ------------------------------------------------
def test_a_cpu_pool_sizes_the_kv_space_instead_of_a_share_of_the_node(tmp_path: Path) -> None:
    from agentkv.vllm._launch import cpu_kv_cache_gib

    model = _model(tmp_path)  # 2048 bytes per token
    p = prepare_profile(str(model), platform="cpu", port=1, block_size=128,
                        num_gpu_blocks_override=9000)  # fmt: skip
    # 9000 x 128 x 2048 bytes = 2.2 GiB -> 3, plus one of slack
    assert p.kv_cache_memory_gib == 4.0 and p.env()["VLLM_CPU_KVCACHE_SPACE"] == "4"
    given = ServeProfile(model=str(model), port=1, platform="cpu", num_gpu_blocks_override=9000,
                         gpu_memory_utilization=0.3)  # fmt: skip
    assert cpu_kv_cache_gib(given, str(model)) is None  # a share asked for is kept
    assert prepare_profile(str(model), platform="cpu", port=1).kv_cache_memory_gib is None


def test_a_server_short_of_memory_says_what_to_change() -> None:
    from agentkv.vllm._launch import CPU_MEMORY_ADVICE, _memory_short

    log = ("ValueError: Available memory on node 0 (8.72/11.71 GiB) on startup is less than "
           "desired CPU memory utilization (0.92, 10.78 GiB).")  # fmt: skip
    assert _memory_short(log) and not _memory_short("ready")
    assert "--kv-cache-memory-gib" in CPU_MEMORY_ADVICE


@pytest.mark.parametrize(
    ("host", "key", "warns"),
    [
        ("127.0.0.1", None, False),
        ("::1", None, False),
        ("localhost", None, False),
        ("0.0.0.0", None, True),
        ("::", None, True),
        ("10.1.2.3", None, True),
        ("gpu-box.internal", None, True),
        ("0.0.0.0", "k", False),
    ],
)
def test_a_public_bind_without_an_api_key_is_warned_about(
    host: str, key: str | None, warns: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentkv.vllm._launch import public_bind_warning

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    said = public_bind_warning(host, key)
    assert (said is not None) is warns
    if said is not None:
        assert "--api-key" in said and host in said
    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    assert public_bind_warning(host, key) is None


def test_serve_on_all_interfaces_without_a_key_logs_the_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with caplog.at_level(logging.WARNING, logger="agentkv"):
        prepare_profile(platform="cpu", port=1, host="0.0.0.0")
    assert any("without an API key" in r.getMessage() for r in caplog.records)
