"""Build the scheduler plugin over vLLM's real scheduler classes, with no model or server.

The offline plugin tests construct ``make_scheduler_class(base)`` over each of vLLM's
scheduler classes: ``Scheduler`` (what the CPU build runs: its platform forces
synchronous scheduling) and ``AsyncScheduler`` (the default of GPU builds). A server
on the CPU build never runs the second, but the class builds and steps offline, so the
plugin's hooks are checked against both on every vLLM that CI or
``scripts/vllm_compat.sh`` installs.

The device is named explicitly (``cpu``): vLLM's GPU wheel on a machine without a GPU
detects no platform, and its config would refuse to guess one. Nothing here runs on
the device; the scheduler only keeps books.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["SCHEDULER_BASES", "Stepper", "make_plugin_scheduler", "sample_step", "scheduler_base"]

#: The vLLM scheduler classes the plugin is applied over (test ids use these names).
SCHEDULER_BASES = ("Scheduler", "AsyncScheduler")


def scheduler_base(name: str) -> type:
    """vLLM's scheduler class called ``name`` (one of :data:`SCHEDULER_BASES`)."""
    if name == "Scheduler":
        from vllm.v1.core.sched.scheduler import Scheduler

        return Scheduler
    if name == "AsyncScheduler":
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        return AsyncScheduler
    raise ValueError(f"unknown vLLM scheduler class {name!r}; one of {SCHEDULER_BASES}")


def make_plugin_scheduler(
    base: str,
    *,
    block_size: int,
    num_blocks: int,
    groups: int = 1,
    max_num_seqs: int = 16,
    policy: str = "fcfs",
    max_model_len: int = 512,
    plugin: bool = True,
) -> Any:
    """The plugin over vLLM's ``base`` scheduler, on a pool of ``num_blocks`` blocks of
    ``block_size`` tokens in each of ``groups`` full-attention KV-cache groups
    (``plugin=False``: vLLM's own ``base``, stock, on the same config)."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from agentkv.models import ensure_tiny_model
    from agentkv.vllm._scheduler import make_scheduler_class

    model = str(ensure_tiny_model())
    vc = VllmConfig(
        model_config=ModelConfig(
            model=model, tokenizer=model, dtype="float32", max_model_len=max_model_len
        ),
        cache_config=CacheConfig(
            block_size=block_size, cache_dtype="auto", enable_prefix_caching=True
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=512,
            max_model_len=max_model_len,
            is_encoder_decoder=False,
            policy=policy,
        ),
        device_config=DeviceConfig(device="cpu"),
    )
    total = num_blocks * groups
    vc.cache_config.num_gpu_blocks = total
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=32, dtype=torch.float32
    )
    kv = KVCacheConfig(
        num_blocks=total,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec([f"layer{g}"], spec) for g in range(groups)],
    )
    cls = make_scheduler_class(scheduler_base(base)) if plugin else scheduler_base(base)
    return cls(
        vllm_config=vc,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(vc),
        block_size=block_size,
        log_stats=False,
    )


def sample_step(scheduler: Any, out: Any) -> Any:
    """The model runner's answer to the step ``out``: token 7 for each scheduled request,
    none for a request whose step is a non-final chunk of its prompt (a runner drops
    what it samples there; ``AsyncScheduler`` counts no output placeholder for it)."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = [r.req_id for r in out.scheduled_new_reqs] + list(out.scheduled_cached_reqs.req_ids)
    chunk = {r for r in ids if scheduler.requests[r].is_prefill_chunk}
    return ModelRunnerOutput(
        req_ids=ids,
        req_id_to_index={r: i for i, r in enumerate(ids)},
        sampled_token_ids=[[] if r in chunk else [7] for r in ids],
    )


class Stepper:
    """Runs scheduling steps the way vLLM's engine core does, with a fake model runner.

    Over ``Scheduler`` each step is scheduled and its output processed before the next
    one. Over ``AsyncScheduler`` two steps are in flight, as in the engine's batch queue:
    a step is scheduled before the output of the previous one comes back, so requests
    carry output placeholders while they are scheduled again.
    """

    def __init__(self, scheduler: Any) -> None:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        self.s = scheduler
        self.overlap = isinstance(scheduler, AsyncScheduler)
        self.in_flight: tuple[Any, Any] | None = None
        self.admitted: list[str] = []  # request ids in the order steps first scheduled them

    def step(self) -> Any:
        """Schedule one step (processing the one in flight, if any); returns its output."""
        out = self.s.schedule()
        self.admitted += [r.req_id for r in out.scheduled_new_reqs]
        sampled = sample_step(self.s, out)
        if not self.overlap:
            self.s.update_from_output(out, sampled)
            return out
        previous, self.in_flight = self.in_flight, (out, sampled)
        if previous is not None:
            self.s.update_from_output(*previous)
        return out

    def flush(self) -> None:
        """Process the output of the step in flight, if any."""
        previous, self.in_flight = self.in_flight, None
        if previous is not None:
            self.s.update_from_output(*previous)

    @property
    def busy(self) -> bool:
        """Requests left to run, or a step whose output has not been processed."""
        return bool(self.s.running or self.s.waiting or self.in_flight is not None)

    def drain(self, max_steps: int) -> None:
        """Step until every request has finished and no output is outstanding."""
        for _ in range(max_steps):
            if not (self.s.running or self.s.waiting):
                self.flush()
                if not self.busy:
                    return
                continue
            self.step()
        raise AssertionError("the scheduler did not drain")


@pytest.fixture(scope="module", params=SCHEDULER_BASES)
def scheduler_base_name(request: pytest.FixtureRequest) -> str:
    """Each vLLM scheduler class in turn (module scope: one plugin instance per class)."""
    return str(request.param)


def block_hasher(block_size: int) -> Any:
    """vLLM's request block hasher (sha256, its none-hash initialised) for blocks of
    ``block_size`` tokens, as the engine core builds it."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    init_none_hash(sha256)
    return get_request_block_hasher(block_size, sha256)


def hinted_request(
    rid: str,
    tokens: list[int],
    hint: dict[str, Any] | None,
    hasher: Any,
    *,
    out: int = 2,
    salt: str | None = None,
    priority: int = 0,
) -> Any:
    """An engine request for ``tokens`` that decodes exactly ``out`` tokens, carrying
    ``hint`` as its ``SamplingParams.extra_args`` (agentkv's ``vllm_xargs``)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=out, min_tokens=out, ignore_eos=True, extra_args=hint)
    return Request(
        rid, tokens, params, None, cache_salt=salt, priority=priority, block_hasher=hasher
    )
