"""``ServeProfile``: the typed launch profile that becomes vLLM's command line.

A profile is data. :meth:`ServeProfile.to_argv` and :meth:`ServeProfile.env` are pure
functions of it (snapshot-tested); platform detection happens once, in
:meth:`ServeProfile.resolve`, which fills ``platform`` and platform defaults. The
benchmark builds its arms from profiles: prefix caching on/off, fp8 KV, offload,
the plugin on/off, and the two hint feature sets switched separately.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentkv._errors import ConfigError
from agentkv.vllm._ratelimit import ControlLimit
from agentkv.vllm._saltgate import SALT_GATE_MIDDLEWARE, SaltLimit
from agentkv.vllm._settings import SchedSettings

__all__ = [
    "CONTROL_MIDDLEWARE",
    "SALT_GATE_MIDDLEWARE",
    "SCHEDULER_CLS",
    "VLLM_MODULE",
    "ServeProfile",
]

SCHEDULER_CLS = "agentkv.vllm._scheduler.AgentKVScheduler"
CONTROL_MIDDLEWARE = "agentkv.vllm._control.control_middleware"
VLLM_MODULE = "vllm.entrypoints.openai.api_server"

_DEFAULT_BLOCK_SIZE = {"cpu": 128, "cuda": 16}


#: The KV cache dtypes the profile takes (vLLM's FP8 variants; the cache namespace names them).
KVCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]
KV_CACHE_DTYPES: tuple[str, ...] = KVCacheDtype.__args__  # type: ignore[attr-defined]


class ServeProfile(BaseModel):
    """How to start vLLM with the agentkv profile (every field has a safe default).

    ``lifecycle_hints`` (retain, release, pressure override) and ``program_scheduling``
    (priority from hints, attained service, aging) switch independently; both need
    ``agentkv_plugin``. The lease policy: ``retention`` (``"predicted"``: every paused
    context is a lease candidate ranked by its forecast return, the one expected back
    last gives way; ``"hint"``: only advised retains, earliest deadline gives way),
    ``admission`` (hold back turns that cannot fit beside the resident contexts; while
    fewer than ``min_running`` calls run, only for a resident context due back within
    ``idle_wait_turns`` mean turn times and sooner than recomputing what the turn could
    evict, at the prefill cost the plugin learns from the engine's steps; at most ``aging_s`` or ``aging_turns`` mean turn
    times, whichever is longer) and
    ``max_retained_fraction`` (of the pool, all leases together); see ``docs/vllm.md``. ``extra_args`` go to vLLM unchanged, after the profile's own,
    and an option named there replaces the profile's value for it.

    KV offload: on GPU builds vLLM's native CPU tier is on (``kv_offload``), sized by
    ``kv_offload_size_gib`` or, unset, by the rule in :mod:`agentkv.vllm._offload`
    (paused trajectories x p90 KV bytes per trajectory x headroom, bounded by host
    memory; ``kv_offload_trajectories`` and ``kv_offload_context_tokens`` set its
    inputs) when :func:`agentkv.serve` prepares the profile. The CPU build has no tier.

    The control route takes at most ``control_burst`` requests at once from one caller,
    then ``control_rate_per_s`` (0: no limit); past that it answers 429 with
    ``Retry-After`` (:mod:`agentkv.vllm._ratelimit`). One source (bearer token, else client
    address) opens at most ``new_salt_burst`` new salt scopes at once, then
    ``new_salt_rate_per_s`` (0: no bound); a hinted request past that is served as stock
    vLLM, its hints dropped and counted (:mod:`agentkv.vllm._saltgate`).

    ``max_client_priority`` clamps the request's own, client-set ``priority`` into
    ``[-max_client_priority, max_client_priority]`` under priority scheduling.
    ``policy_mode`` is how the plugin starts: ``"act"`` applies its decisions,
    ``"shadow"`` makes and counts them (``shadow_*`` stats) while the engine behaves as
    stock vLLM, ``"off"`` is stock vLLM; ``POST /agentkv/v1/mode`` switches at run time.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=False)

    model: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int | None = Field(default=None, ge=0, le=65535)
    platform: Literal["cpu", "cuda"] | None = None
    dtype: str = "auto"
    max_model_len: int | None = Field(default=None, ge=16)
    block_size: int | None = Field(default=None, ge=1)
    enable_prefix_caching: bool = True
    kv_cache_dtype: KVCacheDtype = "auto"
    kv_offload: bool = True
    kv_offload_size_gib: float | None = Field(default=None, gt=0)
    kv_offload_trajectories: int | None = Field(default=None, ge=1)
    kv_offload_context_tokens: int | None = Field(default=None, ge=1)
    kv_offload_backend: str = "native"
    kv_cache_memory_gib: float | None = Field(default=None, gt=0)
    num_gpu_blocks_override: int | None = Field(default=None, ge=2)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    max_num_seqs: int | None = Field(default=None, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    enforce_eager: bool = False
    seed: int | None = 0
    api_key: str | None = None
    prompt_tokens_details: bool = True
    request_id_headers: bool = True
    agentkv_plugin: bool = True
    lifecycle_hints: bool = True
    program_scheduling: bool = True
    scheduling_policy: Literal["fcfs", "priority"] | None = None
    max_ttl_ms: int = Field(default=600_000, ge=0)
    retention: Literal["hint", "predicted"] = "predicted"
    admission: bool = True
    max_retained_fraction: float = Field(default=0.9, ge=0, le=1)
    min_running: int = Field(default=1, ge=0, le=1_000_000)
    idle_wait_turns: float = Field(default=2.0, ge=0)
    priority_bound: int = Field(default=8, ge=0, le=1_000_000)
    aging_s: float = Field(default=10.0, gt=0)
    aging_turns: float = Field(default=8.0, ge=0)
    control_burst: int = Field(default=100, ge=1, le=1_000_000)
    control_rate_per_s: float = Field(default=50.0, ge=0, allow_inf_nan=False)
    new_salt_burst: int = Field(default=64, ge=1, le=1_000_000)
    new_salt_rate_per_s: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    max_client_priority: int = Field(default=1000, ge=0, le=2**62)
    policy_mode: Literal["act", "shadow", "off"] = "act"
    extra_args: list[str] = Field(default_factory=list)
    extra_env: dict[str, str] = Field(default_factory=dict)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'profile'}: "
                f"{err['msg'].removeprefix('Value error, ')}"
                for err in exc.errors()
            )
            raise ConfigError(f"invalid ServeProfile: {problems}") from None

    @model_validator(mode="after")
    def _check(self) -> ServeProfile:
        if self.block_size is not None and self.block_size % 16:
            raise ConfigError(
                f"block_size={self.block_size}: use a multiple of 16 (32 or 64 on the CPU build, "
                "whose kernels need multiples of 32)"
            )
        if self.platform == "cpu" and self.block_size is not None and self.block_size % 32:
            raise ConfigError(
                f"block_size={self.block_size}: the CPU build needs a multiple of 32; use 32 or 64"
            )
        if self.kv_offload_backend != "native":
            raise ConfigError(
                f"kv_offload_backend={self.kv_offload_backend!r}: only 'native' (vLLM's own CPU "
                "tier) is supported; 'lmcache' needs an LMCache server that agentkv does not "
                "start. Remove kv_offload_backend, or pass your own connector in extra_args "
                "(--kv-transfer-config ...)"
            )
        if not self.kv_offload and self.kv_offload_size_gib is not None:
            raise ConfigError(
                "kv_offload_size_gib is set but kv_offload=False (--no-kv-offload); remove one"
            )
        if self.platform == "cpu" and self.kv_offload_size_gib is not None:
            raise ConfigError(
                "kv_offload_size_gib is set but the CPU build cannot offload (the KV cache "
                "already lives in host memory); remove kv_offload_size_gib"
            )
        asked = [
            name
            for name in ("lifecycle_hints", "program_scheduling")
            if name in self.model_fields_set and getattr(self, name)
        ]
        if asked and not self.agentkv_plugin:
            raise ConfigError(
                f"{' and '.join(asked)} need agentkv_plugin=True; set agentkv_plugin=True "
                "or leave them off"
            )
        if self.num_gpu_blocks_override is not None and self.block_size is not None:
            pool = self.pool_tokens()
            if self.max_model_len is not None and pool is not None and pool < self.max_model_len:
                need = math.ceil(self.max_model_len / self.block_size) + 1
                raise ConfigError(
                    f"num_gpu_blocks_override={self.num_gpu_blocks_override} with "
                    f"block_size={self.block_size} holds {pool} tokens, fewer than "
                    f"max_model_len={self.max_model_len} (vLLM refuses to start): raise "
                    f"num_gpu_blocks_override to at least {need} or lower max_model_len to {pool}"
                )
        return self

    # -- derived values ----------------------------------------------------------------
    def effective_block_size(self) -> int:
        """The block size vLLM will use (the platform default when unset)."""
        return self.block_size or _DEFAULT_BLOCK_SIZE[self.platform or "cpu"]

    def pool_tokens(self) -> int | None:
        """Tokens the KV pool holds under ``num_gpu_blocks_override`` (one block is reserved)."""
        if self.num_gpu_blocks_override is None:
            return None
        return (self.num_gpu_blocks_override - 1) * self.effective_block_size()

    def effective_max_model_len(self) -> int | None:
        """``max_model_len``, or the pool size when only the pool was shrunk."""
        if self.max_model_len is not None:
            return self.max_model_len
        return self.pool_tokens()

    def effective_scheduling_policy(self) -> str:
        """``priority`` when program-aware scheduling is on, else ``fcfs`` (unless set)."""
        if self.scheduling_policy is not None:
            return self.scheduling_policy
        return "priority" if self.agentkv_plugin and self.program_scheduling else "fcfs"

    def sched_settings(self) -> SchedSettings:
        """The plugin settings this profile sends to the engine-core process."""
        reason = ""
        if self.platform == "cpu":
            from agentkv.vllm._platform import CPU_OFFLOAD_REASON

            reason = CPU_OFFLOAD_REASON
        elif not self.kv_offload:
            reason = "KV offload is off in this profile (kv_offload=False, --no-kv-offload)"
        elif self.kv_offload_size_gib is None:
            reason = (
                "the KV offload tier could not be sized (the model config was not found "
                "locally); set kv_offload_size_gib"
            )
        return SchedSettings(
            lifecycle=self.agentkv_plugin and self.lifecycle_hints,
            program=self.agentkv_plugin and self.program_scheduling,
            max_ttl_ms=self.max_ttl_ms,
            retention=self.retention,
            admission=self.admission,
            max_retained_fraction=self.max_retained_fraction,
            min_running=self.min_running,
            idle_wait_turns=self.idle_wait_turns,
            priority_bound=self.priority_bound,
            aging_s=self.aging_s,
            aging_turns=self.aging_turns,
            offload_reason=reason,
            max_client_priority=self.max_client_priority,
            mode=self.policy_mode,
        )

    def control_limit(self) -> ControlLimit:
        """The control route's per-caller rate limit this profile sets."""
        return ControlLimit(self.control_burst, self.control_rate_per_s)

    def salt_limit(self) -> SaltLimit:
        """The bound on new salt scopes per source this profile sets."""
        return SaltLimit(self.new_salt_burst, self.new_salt_rate_per_s)

    def resolve(self) -> ServeProfile:
        """Return a copy with ``platform`` detected (when unset) and validated for it."""
        if self.platform is not None:
            return self
        from agentkv.vllm._platform import detect_platform

        # Only the fields the caller set: defaults must stay "unset" so that validation
        # of the copy judges the same choices as the original.
        info = detect_platform()
        if info.name == "cpu" and self.kv_cache_dtype != "auto" and not info.fp8_kv_supported:
            raise ConfigError(
                f"kv_cache_dtype={self.kv_cache_dtype!r}: {info.fp8_kv_reason} (vLLM would die "
                "at start-up); use kv_cache_dtype='auto'"
            )
        data = self.model_dump(exclude_unset=True)
        data["platform"] = info.name
        return ServeProfile(**data)

    # -- argv and environment ----------------------------------------------------------
    def _profile_options(self) -> list[tuple[str, list[str]]]:
        if self.model is None:
            raise ConfigError("the profile has no model; pass model=... (serve() fills it)")
        if self.port is None or self.port == 0:
            raise ConfigError("the profile has no port; pass port=... (serve() picks a free one)")
        opts: list[tuple[str, list[str]]] = [
            ("--model", [self.model]),
            ("--host", [self.host]),
            ("--port", [str(self.port)]),
            ("--dtype", [self.dtype]),
        ]
        if self.served_model_name:
            opts.append(("--served-model-name", [self.served_model_name]))
        mml = self.effective_max_model_len()
        if mml is not None:
            opts.append(("--max-model-len", [str(mml)]))
        if self.block_size is not None:
            opts.append(("--block-size", [str(self.block_size)]))
        opts.append(
            ("--enable-prefix-caching", [])
            if self.enable_prefix_caching
            else ("--no-enable-prefix-caching", [])
        )
        if self.kv_cache_dtype != "auto":
            opts.append(("--kv-cache-dtype", [self.kv_cache_dtype]))
        if self.kv_offload and self.kv_offload_size_gib is not None and self.platform != "cpu":
            opts.append(("--kv-offloading-size", [_num(self.kv_offload_size_gib)]))
            opts.append(("--kv-offloading-backend", [self.kv_offload_backend]))
        if self.kv_cache_memory_gib is not None and self.platform != "cpu":
            opts.append(("--kv-cache-memory-bytes", [str(int(self.kv_cache_memory_gib * 2**30))]))
        if self.num_gpu_blocks_override is not None:
            opts.append(("--num-gpu-blocks-override", [str(self.num_gpu_blocks_override)]))
        if self.gpu_memory_utilization is not None:
            opts.append(("--gpu-memory-utilization", [_num(self.gpu_memory_utilization)]))
        if self.max_num_seqs is not None:
            opts.append(("--max-num-seqs", [str(self.max_num_seqs)]))
        if self.max_num_batched_tokens is not None:
            opts.append(("--max-num-batched-tokens", [str(self.max_num_batched_tokens)]))
        if self.enforce_eager:
            opts.append(("--enforce-eager", []))
        if self.seed is not None:
            opts.append(("--seed", [str(self.seed)]))
        if self.prompt_tokens_details:
            opts.append(("--enable-prompt-tokens-details", []))
        if self.request_id_headers:
            opts.append(("--enable-request-id-headers", []))
        opts.append(("--scheduling-policy", [self.effective_scheduling_policy()]))
        if self.agentkv_plugin:
            opts.append(("--scheduler-cls", [SCHEDULER_CLS]))
            opts.append(("--middleware", [CONTROL_MIDDLEWARE]))
            opts.append(("--middleware", [SALT_GATE_MIDDLEWARE]))
        opts.append(("--disable-uvicorn-access-log", []))
        return opts

    def to_argv(self) -> list[str]:
        """vLLM server arguments (without the interpreter); pure and deterministic.

        An option that also appears in ``extra_args`` (as ``--opt``, ``--opt=v`` or its
        ``--no-`` form) is left out of the profile's part, so the extra value wins.
        """
        overridden = {_option_name(a) for a in self.extra_args if a.startswith("--")}
        argv: list[str] = []
        for opt, values in self._profile_options():
            name = _option_name(opt)
            if name in overridden and opt != "--middleware":
                continue
            argv.append(opt)
            argv.extend(values)
        argv.extend(self.extra_args)
        return argv

    def command(self) -> list[str]:
        """The full command line: ``python -m vllm.entrypoints.openai.api_server ...``."""
        return [sys.executable, "-m", VLLM_MODULE, *self.to_argv()]

    def env(self) -> dict[str, str]:
        """Environment variables the server needs on top of the caller's (pure)."""
        out: dict[str, str] = {}
        if self.agentkv_plugin:
            out.update(self.sched_settings().to_env())
            out.update(self.control_limit().to_env())  # read by the control route
            out.update(self.salt_limit().to_env())  # read by the salt gate
        if self.api_key:
            out["VLLM_API_KEY"] = self.api_key  # kept off the command line (ps shows argv)
        if self.platform == "cpu" and self.kv_cache_memory_gib is not None:
            out["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil(self.kv_cache_memory_gib)))
        out.update(self.extra_env)
        return out


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _option_name(arg: str) -> str:
    name = arg.split("=", 1)[0]
    if name.startswith("--no-"):
        name = "--" + name[len("--no-") :]
    return name
