"""KV-cache size per token, from a Hugging Face model config.

``kv_bytes_per_token(config)`` answers "how many bytes of KV cache does one token of
context hold on the server?" — the ``S`` of the cost model is this times the prefix
length. For a standard decoder with grouped-query attention it is::

    2 (K and V) x num_hidden_layers x num_key_value_heads x head_dim x bytes(kv dtype)

Qwen3-32B in BF16 (64 layers, 8 KV heads, head_dim 128) gives 262,144 bytes per token.

What is modelled: multi-head and grouped-query attention (``num_key_value_heads``,
defaulting to ``num_attention_heads``), an explicit ``head_dim`` or
``hidden_size // num_attention_heads``, the model dtype (``torch_dtype`` / ``dtype``),
an override KV dtype (vLLM's ``--kv-cache-dtype``: ``auto``, ``bfloat16``, ``float16``,
``float32``, ``fp8``, ``fp8_e4m3``, ``fp8_e5m2``), and multimodal configs that nest the
language model under ``text_config``.

What is not modelled (say so when you quote a figure):
- Multi-head latent attention (DeepSeek-style MLA, ``kv_lora_rank`` in the config): the
  cache holds a compressed latent, not K and V; this function raises ``ConfigError``.
- Sliding-window or chunked-attention layers: each layer is counted as full attention,
  so for prompts longer than the window the figure is an upper bound.
- Per-block padding, scale tensors of quantized KV formats, and tensor-parallel
  sharding (the figure is for the whole model, summed over ranks).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError

__all__ = ["DTYPE_BYTES", "kv_bytes_per_token"]

#: Bytes per element of the KV dtypes vLLM accepts (and the model dtypes configs name).
DTYPE_BYTES: dict[str, float] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "bfloat16": 2,
    "bf16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def _as_mapping(config: Any) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(
                f"no model config at {str(config)!r}: pass a config.json path, a model "
                "directory that contains one, a dict, or a transformers config object"
            )
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read model config {str(path)!r}: {exc}") from exc
        if not isinstance(loaded, Mapping):
            raise ConfigError(f"{str(path)!r} does not hold a JSON object")
        return loaded
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        loaded = to_dict()
        if isinstance(loaded, Mapping):
            return loaded
    raise ConfigError(
        f"cannot read a model config from {type(config).__name__}: pass a dict, a "
        "transformers PretrainedConfig, or a path to config.json"
    )


def _positive_int(cfg: Mapping[str, Any], key: str) -> int | None:
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"model config field {key!r} must be a positive integer, got {value!r}")
    return value


def _dtype_name(value: Any) -> str:
    name = str(value).strip().lower()
    return name.removeprefix("torch.")


def kv_bytes_per_token(config: Any, *, kv_dtype: str | None = None) -> int:
    """Bytes of KV cache one token of context occupies, summed over all layers.

    ``config`` is a ``config.json`` dict, a transformers config object, or a path to a
    model directory / ``config.json`` (read locally; nothing is downloaded).
    ``kv_dtype`` is the server's ``--kv-cache-dtype`` (``None`` or ``"auto"``: the model
    dtype; ``"fp8"`` halves a BF16 figure). See the module docstring for what is not
    modelled (MLA raises ``ConfigError``; sliding windows are counted as full layers).

    >>> kv_bytes_per_token({"num_hidden_layers": 64, "num_attention_heads": 64,
    ...     "num_key_value_heads": 8, "head_dim": 128, "torch_dtype": "bfloat16"})
    262144
    """
    cfg = _as_mapping(config)
    text_cfg = cfg.get("text_config")
    if isinstance(text_cfg, Mapping) and "num_hidden_layers" not in cfg:
        merged = dict(text_cfg)
        for key in ("torch_dtype", "dtype"):
            if key not in merged and key in cfg:
                merged[key] = cfg[key]
        cfg = merged
    if cfg.get("kv_lora_rank") is not None:
        raise ConfigError(
            "multi-head latent attention (kv_lora_rank) is not modelled by "
            "kv_bytes_per_token; pass bytes_per_token to CostModel explicitly"
        )
    num_layers = _positive_int(cfg, "num_hidden_layers") or _positive_int(cfg, "n_layer")
    num_heads = _positive_int(cfg, "num_attention_heads") or _positive_int(cfg, "n_head")
    if num_layers is None or num_heads is None:
        raise ConfigError(
            "model config needs num_hidden_layers and num_attention_heads to size the KV cache"
        )
    num_kv_heads = _positive_int(cfg, "num_key_value_heads") or num_heads
    head_dim = _positive_int(cfg, "head_dim")
    if head_dim is None:
        hidden = _positive_int(cfg, "hidden_size") or _positive_int(cfg, "n_embd")
        if hidden is None:
            raise ConfigError("model config needs head_dim or hidden_size to size the KV cache")
        head_dim = hidden // num_heads
    if kv_dtype is None or _dtype_name(kv_dtype) == "auto":
        dtype = _dtype_name(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    else:
        dtype = _dtype_name(kv_dtype)
    if dtype not in DTYPE_BYTES:
        raise ConfigError(
            f"unknown KV dtype {dtype!r}; use one of: {', '.join(sorted(DTYPE_BYTES))}"
        )
    return int(2 * num_layers * num_kv_heads * head_dim * DTYPE_BYTES[dtype])
