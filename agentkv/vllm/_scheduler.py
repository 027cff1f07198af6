"""The agentkv scheduler plugin for vLLM (loaded with ``--scheduler-cls``).

Pass ``--scheduler-cls agentkv.vllm._scheduler.AgentKVScheduler``. vLLM calls that
name with the scheduler's keyword arguments inside the engine-core process; it is a
factory that applies :class:`AgentKVSchedulerMixin` to ``AsyncScheduler`` when async
scheduling is on (GPU builds) and to ``Scheduler`` otherwise (the CPU build).

The mixin holds only hook overrides. Each forwards to the plugin collaborator it keeps
as ``agentkv`` (:class:`agentkv.vllm._plugin.Plugin`: hints, tenancy, priority, the
admission gate and the control operations), which drives the residency controller
(:mod:`agentkv.residency._controller`). Every hook runs guarded: an exception inside
agentkv code is counted (``internal_errors``) and logged, and vLLM's own behaviour
continues. A bug here must never take the engine down; if the plugin fails to start,
the scheduler serves as vLLM's own.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from agentkv.vllm._plugin import Plugin

__all__ = ["AgentKVScheduler", "AgentKVSchedulerMixin", "make_scheduler_class"]

_log = logging.getLogger("agentkv.scheduler")

if TYPE_CHECKING:
    _Base = Any
else:
    _Base = object


class AgentKVSchedulerMixin(_Base):  # type: ignore[misc,valid-type]
    """vLLM ``Scheduler`` / ``AsyncScheduler`` hooks that call the agentkv plugin."""

    agentkv: Plugin | None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agentkv = None
        try:
            self.agentkv = Plugin(self)
        except Exception:
            _log.exception("agentkv plugin setup failed; serving with vLLM's default behaviour")

    def add_request(self, request: Any) -> None:
        plugin = self.agentkv
        if plugin is not None and request.request_id not in self.requests:
            plugin.guarded("add_request", plugin.on_add, request)
        super().add_request(request)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        plugin = self.agentkv
        if plugin is not None:
            plugin.guarded("schedule.before", plugin.before_schedule)
        out = super().schedule(*args, **kwargs)
        if plugin is not None:
            plugin.guarded("schedule.after", plugin.after_schedule, out)
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        plugin = self.agentkv
        if plugin is not None and plugin.mode != "off":
            if plugin.settings.admission:
                plugin.guarded("update_from_output", plugin.admission.time_step, scheduler_output)
            if plugin.lower_tier:
                plugin.guarded("update_from_output.tier", plugin.on_output, model_runner_output)
        return super().update_from_output(scheduler_output, model_runner_output)

    def _handle_blocked_waiting_request(self, request: Any) -> bool:
        ready = bool(super()._handle_blocked_waiting_request(request))
        plugin = self.agentkv
        if not ready or plugin is None:
            return ready
        allowed = plugin.guarded("admission", plugin.admission.allows, request)
        return ready if allowed is None else allowed

    def _free_blocks(self, request: Any) -> None:
        plugin = self.agentkv
        after = None
        if plugin is not None:
            after = plugin.guarded("free_blocks.before", plugin.before_free, request)
        super()._free_blocks(request)
        if plugin is not None and after is not None:
            plugin.guarded("free_blocks.release", plugin.after_free, after)

    def has_requests(self) -> bool:
        # Leases are not work: counting them would keep the engine loop spinning.
        return bool(super().has_requests())

    def reset_prefix_cache(self, *args: Any, **kwargs: Any) -> bool:
        plugin = self.agentkv
        if plugin is not None:
            plugin.guarded("reset_prefix_cache", plugin.reset)
        return bool(super().reset_prefix_cache(*args, **kwargs))

    def agentkv_handle(self, payload: str) -> str:
        """Serve one control-route operation (reached through ``EngineCore.agentkv_control``)."""
        plugin = self.agentkv
        if plugin is None:
            return json.dumps({"status": 503, "error": "the agentkv plugin failed to start"})
        return plugin.control.handle(payload)


_CLASSES: dict[type, type] = {}


def make_scheduler_class(base: type) -> type:
    """Return (cached) ``AgentKVSchedulerMixin`` applied over ``base``."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type(f"AgentKV{base.__name__}", (AgentKVSchedulerMixin, base), {})
        _CLASSES[base] = cls
    return cls


def AgentKVScheduler(**kwargs: Any) -> Any:
    """Build the plugin scheduler over the base vLLM would have used (async or not)."""
    vllm_config = kwargs["vllm_config"]
    base: type
    if getattr(vllm_config.scheduler_config, "async_scheduling", False):
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        base = AsyncScheduler
    else:
        from vllm.v1.core.sched.scheduler import Scheduler

        base = Scheduler
    return make_scheduler_class(base)(**kwargs)


def _engine_control(self: Any, payload: str) -> str:
    handler = getattr(getattr(self, "scheduler", None), "agentkv_handle", None)
    if handler is None:
        return json.dumps({"status": 503, "error": "the agentkv scheduler plugin is not loaded"})
    return str(handler(payload))


def _install_engine_utility() -> None:
    """Add ``EngineCore.agentkv_control`` (reached through vLLM's utility RPC)."""
    try:
        from vllm.v1.engine.core import EngineCore
    except Exception:  # pragma: no cover - vLLM missing or changed
        return
    if not hasattr(EngineCore, "agentkv_control"):
        EngineCore.agentkv_control = _engine_control  # type: ignore[attr-defined]


_install_engine_utility()
