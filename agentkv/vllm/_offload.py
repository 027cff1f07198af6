"""How large the CPU offload tier is by default on GPU builds (pure sizing, and its inputs).

The tier must hold the contexts of the trajectories paused at once, at a high quantile of
their size, with some headroom::

    size = paused trajectories x p90 KV bytes per trajectory x headroom

bounded by host memory (at most :data:`HOST_SHARE` of what the host has available, so the
server's own processes and the harness keep room) and at least :data:`MIN_GIB`.

- **Paused trajectories**: ``kv_offload_trajectories`` where the profile gives it, else
  the engine's concurrency (``max_num_seqs``, else :data:`DEFAULT_TRAJECTORIES`): an
  agent trajectory spends most of its life in tool calls, so nearly every one in flight
  is paused at any moment.
- **p90 KV bytes per trajectory**: ``kv_offload_context_tokens`` (the p90 context length
  in tokens) where given, else the longest context the server accepts
  (``max_model_len``, else the model's ``max_position_embeddings``, capped at
  :data:`DEFAULT_CONTEXT_TOKENS`), times the model's KV bytes per token
  (:func:`agentkv.kv_bytes_per_token`, from its ``config.json`` and the KV dtype).

:func:`compute_offload_size` is the pure rule; :func:`size_offload_tier` reads the model
config and host memory and applies it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_CONTEXT_TOKENS",
    "DEFAULT_TRAJECTORIES",
    "HEADROOM",
    "HOST_SHARE",
    "MIN_GIB",
    "OffloadSizing",
    "compute_offload_size",
    "host_available_bytes",
    "size_offload_tier",
]

HEADROOM = 1.25
HOST_SHARE = 0.5
MIN_GIB = 1.0
DEFAULT_TRAJECTORIES = 64
DEFAULT_CONTEXT_TOKENS = 32_768
_GIB = 2**30


@dataclass(frozen=True, slots=True)
class OffloadSizing:
    """One sizing of the tier and the figures behind it."""

    paused_trajectories: int
    context_tokens_p90: int
    kv_bytes_per_token: int
    headroom: float
    wanted_bytes: int  # the rule's figure before the host bound
    host_available_bytes: int | None
    size_gib: float  # what the profile passes as --kv-offloading-size

    @property
    def bounded_by_host(self) -> bool:
        """The host's memory, not the rule, set the size."""
        return self.size_gib * _GIB < self.wanted_bytes

    def describe(self) -> str:
        """One line for the progress output."""
        text = (
            f"KV offload tier {self.size_gib:g} GiB = {self.paused_trajectories} paused "
            f"trajectories x {self.context_tokens_p90} tokens x {self.kv_bytes_per_token} "
            f"bytes/token x {self.headroom:g} headroom"
        )
        if self.bounded_by_host and self.host_available_bytes is not None:
            text += (
                f", bounded by host memory ({HOST_SHARE:.0%} of "
                f"{self.host_available_bytes / _GIB:.1f} GiB available)"
            )
        return text


def compute_offload_size(
    *,
    paused_trajectories: int,
    context_tokens_p90: int,
    kv_bytes_per_token: int,
    host_available_bytes: int | None,
    headroom: float = HEADROOM,
) -> OffloadSizing:
    """The tier size by the rule in the module docstring (pure)."""
    wanted = int(max(1, paused_trajectories) * max(1, context_tokens_p90) * kv_bytes_per_token)
    wanted = int(wanted * headroom)
    size = wanted / _GIB
    if host_available_bytes is not None:
        size = min(size, HOST_SHARE * host_available_bytes / _GIB)
    size = max(MIN_GIB, math.floor(size * 4) / 4)  # quarter GiB steps
    return OffloadSizing(
        paused_trajectories=max(1, paused_trajectories),
        context_tokens_p90=max(1, context_tokens_p90),
        kv_bytes_per_token=kv_bytes_per_token,
        headroom=headroom,
        wanted_bytes=wanted,
        host_available_bytes=host_available_bytes,
        size_gib=size,
    )


def host_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """``MemAvailable`` of the host in bytes (None where it cannot be read)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _model_config(model: str) -> dict[str, Any] | None:
    path = Path(model)
    cfg = path / "config.json" if path.is_dir() else None
    if cfg is None:
        try:  # a Hugging Face id already in the local cache (nothing is downloaded)
            from huggingface_hub import try_to_load_from_cache

            found = try_to_load_from_cache(model, "config.json")
        except Exception:
            return None
        if not isinstance(found, str):
            return None
        cfg = Path(found)
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def size_offload_tier(
    model: str,
    *,
    kv_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    max_num_seqs: int | None = None,
    trajectories: int | None = None,
    context_tokens: int | None = None,
    host_bytes: int | None = None,
) -> OffloadSizing | None:
    """Size the tier for ``model`` (a local path or a cached Hugging Face id); None when
    its config cannot be read locally or does not size a KV cache (then pass
    ``kv_offload_size_gib``)."""
    from agentkv._errors import ConfigError
    from agentkv.advice._kvsize import kv_bytes_per_token

    cfg = _model_config(model)
    if cfg is None:
        return None
    try:
        per_token = kv_bytes_per_token(cfg, kv_dtype=kv_cache_dtype)
    except ConfigError:
        return None
    tokens = context_tokens or max_model_len
    if tokens is None:
        longest = cfg.get("max_position_embeddings")
        tokens = longest if isinstance(longest, int) and longest > 0 else DEFAULT_CONTEXT_TOKENS
        tokens = min(tokens, DEFAULT_CONTEXT_TOKENS)
    paused = trajectories or max_num_seqs or DEFAULT_TRAJECTORIES
    return compute_offload_size(
        paused_trajectories=paused,
        context_tokens_p90=tokens,
        kv_bytes_per_token=per_token,
        host_available_bytes=host_bytes if host_bytes is not None else host_available_bytes(),
    )
