"""Giving each replica its own compute: :func:`replica_device_env`.

Started side by side with vLLM's defaults, replicas on one machine compute on the same
devices. On the CPU build every replica's worker binds its OpenMP threads with
``VLLM_CPU_OMP_THREADS_BIND=auto``, which reserves the last core for serving and binds
to the rest, the same cores for every replica (measured on 2 cores: both replicas'
workers on core 0, core 1 left to the API servers). On a GPU build every replica sees
every GPU and uses the first.

:func:`replica_device_env` splits what this process may use into one disjoint group per
replica: CPU cores through ``VLLM_CPU_OMP_THREADS_BIND``, GPUs through
``CUDA_VISIBLE_DEVICES`` (``tensor_parallel_size`` of them per replica). It leaves a
variable alone when the caller already set it, and splits nothing when there are fewer
devices than replicas need (then they share, as before, and the reason says so).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

__all__ = ["cpu_groups", "replica_device_env", "visible_gpus"]

CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
GPU_ENV = "CUDA_VISIBLE_DEVICES"


def cpu_groups(cpus: Sequence[int], replicas: int) -> list[list[int]] | None:
    """``cpus`` split into ``replicas`` contiguous groups of near-equal size (pure), or
    None when there are fewer CPUs than replicas."""
    ordered = sorted(set(cpus))
    if replicas < 1 or len(ordered) < replicas:
        return None
    base, extra = divmod(len(ordered), replicas)
    groups, start = [], 0
    for i in range(replicas):
        size = base + (1 if i < extra else 0)
        groups.append(ordered[start : start + size])
        start += size
    return groups


def _cpu_spec(group: Sequence[int]) -> str:
    """vLLM's bind syntax: ``a-b`` for a run of consecutive cores, runs joined by commas."""
    parts: list[str] = []
    for _, run in itertools.groupby(enumerate(sorted(group)), key=lambda ic: ic[1] - ic[0]):
        cores = [cpu for _, cpu in run]
        parts.append(f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0]))
    return ",".join(parts)


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else the ones
    ``nvidia-smi -L`` lists (none without it)."""
    env = os.environ if environ is None else environ
    if GPU_ENV in env:
        return [d.strip() for d in env[GPU_ENV].split(",") if d.strip()]
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def replica_device_env(
    platform: str,
    replicas: int,
    *,
    cpus: Sequence[int] | None = None,
    environ: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    tensor_parallel_size: int = 1,
) -> tuple[list[dict[str, str]], str | None]:
    """One environment per replica that gives it its own devices, and why not, if not.

    ``platform`` is the profile's (``cpu`` or ``cuda``); ``cpus`` the CPUs this process
    may use (default: its affinity); ``environ`` the process environment (default
    ``os.environ``: its ``CUDA_VISIBLE_DEVICES`` is the set of GPUs to split);
    ``extra_env`` the profile's own variables. A device variable the caller set (CPU
    binding anywhere, GPUs in ``extra_env``) is left alone. Returns ``(envs, reason)``:
    ``reason`` is None when every replica got its own devices, else a sentence for the log.
    """
    empty: list[dict[str, str]] = [{} for _ in range(replicas)]
    env = os.environ if environ is None else environ
    extra = extra_env or {}
    if replicas < 2:
        return empty, None
    if platform == "cpu":
        if CPU_BIND_ENV in env or CPU_BIND_ENV in extra:
            return empty, f"{CPU_BIND_ENV} is set: every replica binds as it says"
        if cpus is None:
            cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        groups = cpu_groups(cpus, replicas)
        if groups is None:
            return empty, f"{len(cpus)} CPUs for {replicas} replicas: they share them"
        return [{CPU_BIND_ENV: _cpu_spec(g)} for g in groups], None
    if platform == "cuda":
        if GPU_ENV in extra:
            return empty, f"{GPU_ENV} is set in the profile: every replica uses it"
        devices = visible_gpus(env)
        per = max(1, tensor_parallel_size)
        if len(devices) < replicas * per:
            return empty, f"{len(devices)} GPUs for {replicas} replicas x {per}: they share them"
        groups_gpu = [devices[i * per : (i + 1) * per] for i in range(replicas)]
        return [{GPU_ENV: ",".join(g)} for g in groups_gpu], None
    return empty, f"no per-replica device split on platform {platform!r}"
