"""The benchmark's ablation arms as :class:`~agentkv.ServeProfile` variants.

======  ====================================================================
arm     server
======  ====================================================================
A       no prefix caching (stock vLLM)
B       prefix caching (stock vLLM): the baseline every ratio is taken against
C       B + FP8 KV cache
D       B + KV offload to a lower tier (GPU builds only)
E       B + agentkv leases: predicted retention, program-level admission, release,
        pressure override
F       B + agentkv program-aware scheduling (priority, attained service, aging)
G       everything the platform has: C + D + E + F
L       the limit: B with a pool that holds the whole workload (nothing is
        ever evicted); headroom captured is measured between B and L
R       B behind vllm-router with its Program scheduling, fed agentkv's metadata
R+      R with the agentkv plugin on the replicas (G's settings, but the router
        admits: the plugin's own program-level admission is off)
======  ====================================================================

Every arm gets the same KV pool *memory*: an FP8 arm holds twice the tokens of a
16-bit arm in the same bytes, which is what quantization buys. On a platform where an
arm cannot run, :func:`arm_unavailable` says why, and the report shows "not run" with
that reason, never a number. G takes what the platform has: on a CPU without AVX-512
or AMX (no FP8 KV) and without a lower tier it is E + F, and :func:`arm_description`
says which parts were left out and why.

Arm L is the one exception to the shared pool: its pool holds the whole workload (see
:func:`agentkv.workload._pool.plan_limit`, beside :func:`~agentkv.workload._pool.plan_pool`,
which sizes the shared one).
"""

from __future__ import annotations

from typing import Any

from agentkv._errors import ConfigError
from agentkv.vllm._platform import PlatformInfo
from agentkv.workload._pool import ArmPlan

__all__ = [
    "ALL_ARMS",
    "ARM_DESCRIPTIONS",
    "ROUTER_SCHEDULED_ARMS",
    "arm_description",
    "arm_options",
    "arm_unavailable",
    "parse_arms",
    "uses_fp8",
]

ALL_ARMS = ("A", "B", "C", "D", "E", "F", "G", "L", "R", "R+")

#: Arms whose router runs vllm-router's Program scheduling.
ROUTER_SCHEDULED_ARMS = frozenset({"R", "R+"})

ARM_DESCRIPTIONS: dict[str, str] = {
    "A": "no prefix caching",
    "B": "prefix caching (stock vLLM)",
    "C": "B + FP8 KV cache",
    "D": "B + KV offload",
    "E": "B + agentkv leases (predicted retention, admission, release, pressure)",
    "F": "B + program-aware scheduling (priority/attained service)",
    "G": "everything (C + D + E + F where available)",
    "L": "limit: B with a pool that holds the whole workload",
    "R": "B + vllm-router Program scheduling fed agentkv's metadata",
    "R+": "R + the agentkv plugin on the replicas (G's settings; the router admits)",
}

CPU_OFFLOAD_REASON = (
    "the CPU build keeps the KV cache in host memory already; there is no lower tier to "
    "offload to (run arm D on a GPU build)"
)


def parse_arms(text: str) -> list[str]:
    """Parse ``"B,E,G"`` into arm names (B is added: every ratio is against it)."""
    arms = [a.strip().upper() for a in text.split(",") if a.strip()]
    bad = [a for a in arms if a not in ALL_ARMS]
    if bad:
        raise ConfigError(f"unknown arm(s) {', '.join(bad)}: choose from {', '.join(ALL_ARMS)}")
    if "B" not in arms:
        arms.insert(0, "B")
    return list(dict.fromkeys(arms))


def arm_unavailable(arm: str, platform: PlatformInfo) -> str | None:
    """Why ``arm`` cannot run on ``platform`` at all, or None."""
    if arm == "D" and not platform.offload_supported:
        return CPU_OFFLOAD_REASON if platform.name == "cpu" else platform.offload_reason
    if arm == "C" and not platform.fp8_kv_supported:
        return platform.fp8_kv_reason or "FP8 KV cache is not supported here"
    if arm in ROUTER_SCHEDULED_ARMS and not _router_installed():
        return "vllm-router is not installed (pip install 'agentkv-cache[router]')"
    return None


def _router_installed() -> bool:
    import importlib.util
    import shutil

    return shutil.which("vllm-router") is not None or (
        importlib.util.find_spec("vllm_router") is not None
    )


def uses_fp8(arm: str, platform: PlatformInfo) -> bool:
    """Whether ``arm`` runs an FP8 KV cache on ``platform`` (twice the blocks)."""
    return arm == "C" or (arm in ("G", "R+") and platform.fp8_kv_supported)


def _uses_offload(arm: str, platform: PlatformInfo) -> bool:
    return arm == "D" or (arm in ("G", "R+") and platform.offload_supported)


def arm_description(arm: str, platform: PlatformInfo, limit: ArmPlan | None = None) -> str:
    """What ``arm`` runs on ``platform``; for G, which parts the platform left out and why;
    for L, how its pool was sized (``limit``: its plan)."""
    text = ARM_DESCRIPTIONS[arm]
    if arm == "L" and limit is not None:
        return text + (
            f" ({limit.pool_blocks} blocks = every block the workload writes + one longest "
            "context per trajectory in flight)"
        )
    if arm not in ("G", "R+"):
        return text
    missing = []
    if not platform.fp8_kv_supported:
        missing.append(f"no FP8: {platform.fp8_kv_reason}")
    if not platform.offload_supported:
        missing.append(f"no offload: {platform.offload_reason}")
    return text + (f" [{'; '.join(missing)}]" if missing else "")


def arm_options(arm: str, plan: ArmPlan, platform: PlatformInfo) -> dict[str, Any]:
    """:class:`~agentkv.ServeProfile` fields for ``arm`` (the model is added by the caller)."""
    fp8 = uses_fp8(arm, platform)
    plugin = arm in ("E", "F", "G", "R+")
    blocks = plan.pool_blocks * (2 if fp8 else 1)
    opts: dict[str, Any] = {
        "block_size": plan.block_size,
        # one block of the override is reserved by vLLM: add it back
        "num_gpu_blocks_override": blocks + 1,
        "max_model_len": plan.max_model_len,
        "enable_prefix_caching": arm != "A",
        "kv_cache_dtype": "fp8" if fp8 else "auto",
        "agentkv_plugin": plugin,
        "lifecycle_hints": arm in ("E", "G", "R+"),
        "program_scheduling": arm in ("F", "G", "R+"),
        # one admission layer: behind Program scheduling the router holds programs back
        "admission": arm != "R+",
        "seed": 0,
    }
    # Only D, G and R+ run the CPU tier (on GPUs; the profile turns it on by default there).
    opts["kv_offload"] = _uses_offload(arm, platform)
    if _uses_offload(arm, platform):
        opts["kv_offload_size_gib"] = plan.offload_size_gib
    return opts
