"""Shared pytest fixtures that start real vLLM servers on the tiny local model.

Import with ``from tests.support.server_fixtures import *`` (tests/conftest.py does). Starting a
server takes about a minute on two cores, so servers are session-scoped and shared:
:func:`agentkv_server_factory` returns ``get(**options)``, and every test asking for
the same options gets the same :class:`agentkv.Server`. At most
``AGENTKV_TEST_MAX_SERVERS`` (default 2: the plugin and the stock server side by side) run at once; asking for a new configuration
stops the least recently used one. Tests using these fixtures must be marked
``@pytest.mark.server``.

Fixtures:
- ``agentkv_server_factory``: ``get(**ServeProfile options) -> Server``; ``get.stop_all()``.
- ``agentkv_server``: the agentkv profile (plugin on, both hint feature sets) on a
  small pool: block size 32, 64 blocks (2,016 tokens), ``max_model_len`` 2000.
- ``stock_server``: the same pool with stock vLLM (no plugin, FCFS, prefix caching on).
- ``security_server``: the agentkv profile on the same pool with an API key
  (:data:`SECURITY_API_KEY`) and a lease lifetime of 4 s, for the hostile-client tests.
- ``smollm2_server``: the agentkv profile on the same pool serving the embedded real model
  (``model="smollm2"``) in float32, the dtype its weights are stored in, so that its greedy
  answers can be held to a float32 reference token for token (vLLM's CPU default would
  serve it in bfloat16).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.requires import require_smollm2_wheel, require_vllm, unavailable

__all__ = [
    "SECURITY_API_KEY",
    "SECURITY_OPTIONS",
    "SMALL_POOL",
    "SMOLLM2_OPTIONS",
    "agentkv_server",
    "agentkv_server_factory",
    "require_vllm",
    "security_server",
    "smollm2_server",
    "stock_server",
    "unavailable",
]

#: Pool and start-up options of the shared test servers (fast start: eager, explicit KV size).
SMALL_POOL: dict[str, Any] = {
    "block_size": 32,
    "num_gpu_blocks_override": 64,
    "max_model_len": 2000,
    "enforce_eager": True,
    "kv_cache_memory_gib": 1,
    "max_num_seqs": 16,
    # Every test of a session is one caller of the control route (one address, one key):
    # the route's rate limit is off here and tested on its own (test_control_ratelimit.py).
    "control_rate_per_s": 0,
}


SECURITY_API_KEY = "agentkv-test-key"
#: The hostile-client server: an API key (the operator's side of tenancy) and leases that
#: live at most 4 s per pause, so the lifetime cap shows within a test.
SECURITY_OPTIONS: dict[str, Any] = {
    **SMALL_POOL,
    "api_key": SECURITY_API_KEY,
    "extra_env": {"AGENTKV_SCHED_MAX_LEASE_LIFETIME_MS": "4000"},
}

#: The real-model server: SmolLM2-135M-Instruct, served in float32.
SMOLLM2_OPTIONS: dict[str, Any] = {**SMALL_POOL, "model": "smollm2", "dtype": "float32"}


class _ServerPool:
    def __init__(self, max_live: int) -> None:
        self.max_live = max(1, max_live)
        self.live: OrderedDict[str, Any] = OrderedDict()

    def __call__(self, **options: Any) -> Any:
        import agentkv

        require_vllm()
        key = json.dumps(options, sort_keys=True, default=str)
        server = self.live.get(key)
        if server is not None and server.running:
            self.live.move_to_end(key)
            return server
        if server is not None:
            self.live.pop(key)
        while len(self.live) >= self.max_live:
            _, old = self.live.popitem(last=False)
            old.stop()
        server = agentkv.serve(
            timeout_s=float(os.environ.get("AGENTKV_TEST_SERVE_TIMEOUT_S", 900)), **options
        )
        self.live[key] = server
        return server

    def stop_all(self) -> None:
        while self.live:
            _, server = self.live.popitem(last=False)
            server.stop()


@pytest.fixture(scope="session")
def agentkv_server_factory() -> Iterator[Callable[..., Any]]:
    """``get(**options) -> Server``: one shared server per distinct option set."""
    pool = _ServerPool(int(os.environ.get("AGENTKV_TEST_MAX_SERVERS", "2")))
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture()
def agentkv_server(agentkv_server_factory: Callable[..., Any]) -> Any:
    """A running agentkv-profile server (plugin on) on the small test pool."""
    return agentkv_server_factory(**SMALL_POOL)


@pytest.fixture()
def stock_server(agentkv_server_factory: Callable[..., Any]) -> Any:
    """A running stock-vLLM server (no plugin, FCFS) on the same small pool."""
    return agentkv_server_factory(
        **SMALL_POOL, agentkv_plugin=False, lifecycle_hints=False, program_scheduling=False
    )


@pytest.fixture()
def security_server(agentkv_server_factory: Callable[..., Any]) -> Any:
    """A running agentkv-profile server with an API key and a 4 s lease lifetime."""
    return agentkv_server_factory(**SECURITY_OPTIONS)


@pytest.fixture()
def smollm2_server(agentkv_server_factory: Callable[..., Any]) -> Any:
    """A running agentkv-profile server on the small pool serving SmolLM2 in float32."""
    require_smollm2_wheel()
    return agentkv_server_factory(**SMOLLM2_OPTIONS)
