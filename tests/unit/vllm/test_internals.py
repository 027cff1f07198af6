"""The vLLM internals the scheduler plugin and the control route reach into, one check each.

vLLM's scheduler interface is not public: a release can rename a hook, reorder a
parameter or change what a queue holds without notice, and a renamed hook is silently
never called. Each case below names one internal (its id is what a failure reports in
``scripts/vllm_compat.sh``'s table) and checks that it exists with the shape the plugin
relies on. The behaviour behind them is checked by the offline plugin tests; these say
which seam moved. Cases that need a scheduler run over both of vLLM's scheduler classes.
Marked ``server``: it imports vLLM.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.offline_scheduler import make_plugin_scheduler
from tests.support.requires import require_vllm

pytestmark = pytest.mark.server


def _params(fn: Callable[..., Any]) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def _has_params(fn: Callable[..., Any], *names: str) -> None:
    params = _params(fn)
    assert list(names) == params[: len(names)], f"{fn.__qualname__}{tuple(params)}"


@pytest.fixture(scope="module")
def sched(scheduler_base_name: str) -> Iterator[Any]:
    require_vllm()
    yield make_plugin_scheduler(
        scheduler_base_name, block_size=16, num_blocks=17, policy="priority", max_num_seqs=2
    )


# -- the scheduler's hooks and state (over both classes) ------------------------------------
def _hooks(s: Any) -> None:
    base = next(c for c in type(s).__mro__ if c.__module__.startswith("vllm."))
    _has_params(base.add_request, "request")
    _has_params(base.update_from_output, "scheduler_output", "model_runner_output")
    _has_params(base._free_blocks, "request")
    _has_params(base._handle_blocked_waiting_request, "request")
    assert not _params(base.has_requests)
    assert callable(base.schedule) and callable(base.reset_prefix_cache)


def _state(s: Any) -> None:
    assert isinstance(s.requests, dict) and isinstance(s.running, list)
    assert isinstance(s.block_size, int) and s.vllm_config is not None
    assert str(getattr(s.policy, "value", s.policy)) in ("fcfs", "priority")
    assert len(s.kv_cache_config.kv_cache_groups) == 1
    assert isinstance(s.scheduler_reserve_full_isl, bool)


def _waiting_heap(s: Any) -> None:
    # Priority policy: the waiting queue is a heap the plugin re-heapifies after aging.
    assert isinstance(s.waiting._heap, list)
    assert list(iter(s.waiting)) == []


def _allocate_slots(s: Any) -> None:
    # The plugin wraps it on the instance; the wrapper reads the token count as the
    # second positional argument or by name.
    _has_params(type(s.kv_cache_manager).allocate_slots, "request", "num_new_tokens")
    assert s.kv_cache_manager.allocate_slots.__qualname__.startswith("Plugin._wrap_allocate")


def _block_pool(s: Any) -> None:
    pool = s.kv_cache_manager.block_pool
    _has_params(pool.get_cached_block, "block_hash", "kv_cache_group_ids")
    _has_params(pool.touch, "blocks")
    _has_params(pool.free_blocks, "ordered_blocks")
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1  # the null block
    assert pool.get_cached_block(b"\0" * 32, [0]) is None  # a miss is None, not []


def _free_block_queue(s: Any) -> None:
    queue = s.kv_cache_manager.block_pool.free_block_queue
    for name in ("remove", "prepend_n", "get_all_free_blocks"):
        assert callable(getattr(queue, name)), name
    block = queue.get_all_free_blocks()[0]
    for field in ("block_id", "ref_cnt", "is_null", "prev_free_block", "block_hash"):
        assert hasattr(block, field), field


def _touch_and_free(s: Any) -> None:
    # A lease: touch takes a free block out of the free queue, free_blocks puts it back.
    pool = s.kv_cache_manager.block_pool
    block = pool.free_block_queue.get_all_free_blocks()[-1]
    free = pool.get_num_free_blocks()
    pool.touch([block])
    assert block.ref_cnt == 1 and pool.get_num_free_blocks() == free - 1
    pool.free_blocks([block])
    assert block.ref_cnt == 0 and pool.get_num_free_blocks() == free


def _scheduler_output(s: Any) -> None:
    out = s.schedule()
    assert list(out.scheduled_new_reqs) == [] and dict(out.num_scheduled_tokens) == {}
    assert list(out.scheduled_cached_reqs.req_ids) == []
    from vllm.v1.core.sched.output import NewRequestData

    fields = getattr(NewRequestData, "__dataclass_fields__", {})
    assert "req_id" in fields and "num_computed_tokens" in fields


SCHEDULER_CASES: dict[str, Callable[[Any], None]] = {
    "hooks": _hooks,
    "state": _state,
    "waiting-heap": _waiting_heap,
    "KVCacheManager.allocate_slots": _allocate_slots,
    "BlockPool": _block_pool,
    "FreeKVCacheBlockQueue": _free_block_queue,
    "BlockPool.touch+free_blocks": _touch_and_free,
    "SchedulerOutput": _scheduler_output,
}


@pytest.mark.parametrize("case", list(SCHEDULER_CASES))
def test_scheduler_internal(sched: Any, case: str) -> None:
    SCHEDULER_CASES[case](sched)


# -- request, configuration, engine core, metrics (class-independent) ----------------------
def _request() -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request, RequestStatus

    params = SamplingParams(max_tokens=1, extra_args={"agentkv_trajectoryId": "t"})
    r = Request("r", [1, 2, 3], params, None, cache_salt="s", priority=3)
    assert r.sampling_params.extra_args == {"agentkv_trajectoryId": "t"}
    assert (r.request_id, r.priority, r.cache_salt, r.num_tokens) == ("r", 3, "s", 3)
    assert r.num_computed_tokens == 0 and r.num_preemptions == 0 and r.kv_hints is None
    assert isinstance(r.block_hashes, list) and isinstance(r.arrival_time, float)
    assert r.is_prefill_chunk is False
    assert str(RequestStatus.FINISHED_STOPPED) == "FINISHED_STOPPED"
    assert str(RequestStatus.FINISHED_LENGTH_CAPPED) == "FINISHED_LENGTH_CAPPED"
    assert RequestStatus.is_finished(RequestStatus.FINISHED_ABORTED)


def _block_hasher() -> None:
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    _has_params(get_request_block_hasher, "hash_block_size", "caching_hash_fn")
    _has_params(init_none_hash, "hash_fn")


def _scheduler_config() -> None:
    from vllm.config import SchedulerConfig

    fields = SchedulerConfig.__dataclass_fields__
    for name in ("scheduler_cls", "async_scheduling", "policy", "scheduler_reserve_full_isl"):
        assert name in fields, name
    assert callable(SchedulerConfig.get_scheduler_cls)


def _kv_transfer_config() -> None:
    from vllm.config import KVTransferConfig

    fields = KVTransferConfig.__dataclass_fields__
    assert "kv_connector" in fields and "kv_connector_extra_config" in fields


def _kv_hints_envelope() -> None:
    from vllm.v1.kv_hints import KvHintAction, KvHintsEnvelope

    assert KvHintsEnvelope.__struct_fields__ == ("protocol_version", "message_id", "actions")
    assert KvHintAction.__struct_fields__ == (
        "action_id",
        "action_type",
        "action_version",
        "payload",
    )


def _engine_core_utility() -> None:
    # The control route's method lands on EngineCore, called by name through the utility RPC.
    from vllm.v1.engine.core import EngineCore, EngineCoreProc

    import agentkv.vllm._scheduler  # noqa: F401  (installs EngineCore.agentkv_control)

    assert callable(EngineCore.agentkv_control)  # type: ignore[attr-defined]
    assert callable(EngineCoreProc._handle_client_request)


def _engine_client_calls() -> None:
    from vllm.v1.engine.core_client import AsyncMPClient

    _has_params(AsyncMPClient.call_utility_async, "method", "args")
    params = inspect.signature(AsyncMPClient._call_utility_async).parameters
    assert "engine" in params and params["engine"].kind is inspect.Parameter.KEYWORD_ONLY


def _prometheus_registry() -> None:
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    assert get_prometheus_registry() is not None


CASES: dict[str, Callable[[], None]] = {
    "Request": _request,
    "block-hasher": _block_hasher,
    "SchedulerConfig": _scheduler_config,
    "KVTransferConfig": _kv_transfer_config,
    "KvHintsEnvelope": _kv_hints_envelope,
    "EngineCore-utility": _engine_core_utility,
    "engine-client-utility-calls": _engine_client_calls,
    "prometheus-registry": _prometheus_registry,
}


@pytest.mark.parametrize("case", list(CASES))
def test_internal(case: str) -> None:
    require_vllm()
    CASES[case]()
