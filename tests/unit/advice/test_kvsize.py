"""kv_bytes_per_token: GQA, head_dim, dtypes, fp8, config sources, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentkv import ConfigError, kv_bytes_per_token
from tests.support.requires import require_module

QWEN3_32B = {
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 5120,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "torch_dtype": "bfloat16",
}


def test_qwen3_32b_bf16_is_262144_bytes_per_token() -> None:
    assert kv_bytes_per_token(QWEN3_32B) == 262_144


def test_fp8_kv_dtype_halves_bf16() -> None:
    assert kv_bytes_per_token(QWEN3_32B, kv_dtype="fp8") == 131_072
    assert kv_bytes_per_token(QWEN3_32B, kv_dtype="auto") == 262_144


def test_mha_defaults_kv_heads_to_attention_heads_and_head_dim_from_hidden() -> None:
    cfg = {
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 64,
        "torch_dtype": "float32",
    }
    assert kv_bytes_per_token(cfg) == 2 * 2 * 4 * 16 * 4


def test_transformers_config_object() -> None:
    transformers = require_module("transformers")
    cfg = transformers.LlamaConfig(
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        hidden_size=256,
        torch_dtype="float16",
    )
    assert kv_bytes_per_token(cfg) == 2 * 4 * 2 * 32 * 2


def test_model_directory_and_file_path(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_32B))
    assert kv_bytes_per_token(tmp_path) == 262_144
    assert kv_bytes_per_token(str(tmp_path / "config.json")) == 262_144


def test_multimodal_text_config_is_used() -> None:
    cfg = {
        "text_config": {k: v for k, v in QWEN3_32B.items() if k != "torch_dtype"},
        "torch_dtype": "bfloat16",
    }
    assert kv_bytes_per_token(cfg) == 262_144


def test_mla_is_refused_with_advice() -> None:
    cfg = dict(QWEN3_32B, kv_lora_rank=512)
    with pytest.raises(ConfigError, match="not modelled"):
        kv_bytes_per_token(cfg)


@pytest.mark.parametrize(
    "bad",
    [
        {"num_hidden_layers": 2},
        {"num_hidden_layers": 0, "num_attention_heads": 2, "hidden_size": 8},
    ],
)
def test_incomplete_or_invalid_config_raises(bad: dict[str, int]) -> None:
    with pytest.raises(ConfigError):
        kv_bytes_per_token(bad)


def test_unknown_dtype_and_missing_path_raise(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown KV dtype"):
        kv_bytes_per_token(QWEN3_32B, kv_dtype="int3")
    with pytest.raises(ConfigError, match="no model config"):
        kv_bytes_per_token(tmp_path / "missing")
