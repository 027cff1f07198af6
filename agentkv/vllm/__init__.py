"""agentkv's vLLM side: launch profile, server handle, scheduler plugin, control route.

Importing this package does not import vLLM. The plugin pieces are named on vLLM's
command line (the profile does it): ``--scheduler-cls
agentkv.vllm._scheduler.AgentKVScheduler`` and ``--middleware
agentkv.vllm._control.control_middleware``.
"""

from __future__ import annotations

from agentkv.vllm._launch import Server, find_free_port, prepare_profile
from agentkv.vllm._profile import CONTROL_MIDDLEWARE, SCHEDULER_CLS, ServeProfile
from agentkv.vllm._replicas import ReplicaSet
from agentkv.vllm._serve import serve

__all__ = [
    "CONTROL_MIDDLEWARE",
    "SCHEDULER_CLS",
    "ReplicaSet",
    "ServeProfile",
    "Server",
    "find_free_port",
    "prepare_profile",
    "serve",
]
