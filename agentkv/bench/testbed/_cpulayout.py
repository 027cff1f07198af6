"""Where a CPU server's processes run on a small machine: the ``split`` layout.

vLLM's CPU backend binds the model worker to its own cores (``VLLM_CPU_OMP_THREADS_BIND
=auto`` leaves the rest "reserved" for serving) but lets the API server and the engine
core float over every core. The engine core schedules synchronously on the CPU build: it
and the worker take turns, and while the worker computes a step the engine core
busy-polls for the result (``sched_yield`` for up to a second after each read). Floating,
that poll burns the cores the API server and the client need, and on a 2-core machine a
third of one core over a replay.

``split`` keeps the engine core on the worker's cores, where its poll yields to the
worker it is waiting for, and moves the API server (and, around each replay, the bench's
own process: the client) to the remaining cores. Nothing changes on a machine where the
worker already has every core, and on other platforms.

:func:`plan_cpu_layout` is pure; :func:`apply_cpu_layout` and :func:`pinned` set thread
affinities (Linux).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["CPU_LAYOUTS", "apply_cpu_layout", "pin_engine_core", "pinned", "plan_cpu_layout"]

CPU_LAYOUTS = ("split", "vllm")
_log = logging.getLogger("agentkv")


def plan_cpu_layout(allowed: set[int], worker: set[int]) -> dict[str, set[int]] | None:
    """CPUs per role for the ``split`` layout, or None when there is nothing to split.

    ``allowed`` are the CPUs the server may use, ``worker`` those its model worker is
    bound to.
    """
    worker = worker & allowed
    frontend = allowed - worker
    if not worker or not frontend:
        return None
    return {"worker": worker, "engine_core": worker, "api_server": frontend, "client": frontend}


def _set_threads(pid: int, cpus: set[int]) -> None:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = [str(pid)]
    for tid in tids:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), cpus)


def _server_cpus(server_pid: int) -> tuple[dict[str, int], set[int], set[int]] | None:
    """A server's process ids by role, the CPUs it may use and its worker's CPUs."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    from agentkv.bench.testbed._costs import ProcessSampler

    pids = ProcessSampler(server_pid).pids
    if "engine_core" not in pids or "worker" not in pids:
        return None
    try:
        return (
            pids,
            set(os.sched_getaffinity(server_pid)),
            set(os.sched_getaffinity(pids["worker"])),
        )
    except OSError:
        return None


def apply_cpu_layout(server_pid: int) -> dict[str, list[int]] | None:
    """Apply ``split`` to a running CPU server; return the CPUs per role, or None."""
    found = _server_cpus(server_pid)
    if found is None:
        return None
    pids, allowed, worker = found
    plan = plan_cpu_layout(allowed, worker)
    if plan is None:
        return None
    _set_threads(pids["engine_core"], plan["engine_core"])
    _set_threads(pids["api_server"], plan["api_server"])
    _log.debug("cpu layout for server %d: %s", server_pid, plan)
    return {role: sorted(cpus) for role, cpus in plan.items()}


def pin_engine_core(server_pid: int) -> dict[str, list[int]] | None:
    """Replicas side by side: keep a server's engine core on its worker's CPUs (its poll
    then yields to its own worker, not to another replica's); the API server floats.
    Returns the CPUs per role, or None where there is nothing to pin."""
    found = _server_cpus(server_pid)
    if found is None:
        return None
    pids, allowed, worker = found
    _set_threads(pids["engine_core"], worker)
    return {"worker": sorted(worker), "engine_core": sorted(worker), "api_server": sorted(allowed)}


@contextlib.contextmanager
def pinned(cpus: Any) -> Iterator[None]:
    """Run this process's threads on ``cpus`` inside the block (no-op when falsy)."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    _set_threads(os.getpid(), set(cpus))
    try:
        yield
    finally:
        _set_threads(os.getpid(), set(before))
