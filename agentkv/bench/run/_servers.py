"""The servers one pool fraction's arms run on, behind one interface: :class:`ServerSet`.

The runner drives every set the same way: for each :class:`Stage` the set plans, it
starts the stage's arms, measures each one's testbed, runs the stage's replays in their
order (each after :meth:`ServerSet.cold` emptied the arm's cache) and releases the arms;
whatever is still up is stopped at the end, after an error too.

Two sets, two run orders:

- :class:`ArmServers`, one server per arm: every arm's server starts at once (at most
  ``max_parallel_starts`` at a time) in a single stage, and each repetition visits the
  arms in a freshly shuffled order, so an arm's place changes from one repetition to the
  next;
- :class:`~agentkv.bench.run._replicas.ReplicaServers`, N replicas behind vllm-router:
  N replicas are all the machine holds, so each arm is a stage of its own, in a shuffled
  order that keeps arms sharing replicas next to each other, and runs every repetition
  before the next arm starts.

Before every replay an arm's cache is empty: right after its server started
(``fresh``), else by ``/reset_prefix_cache`` on every server the arm runs on (which also
drops the plugin's leases), else, when a reset is refused, by a restart. Measuring the
testbed fills the cache, so an arm measured after its start is no longer fresh.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from agentkv.bench.testbed._cpulayout import apply_cpu_layout, pinned
from agentkv.bench.testbed._probe import CalibrationPlan, measure_server
from agentkv.bench.testbed._scrape import server_urls
from agentkv.vllm._platform import PlatformInfo
from agentkv.workload._pool import ArmPlan

__all__ = ["ArmServers", "BaseServerSet", "ServerSet", "Stage", "reset_caches"]

_log = logging.getLogger("agentkv")

Notify = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class Stage:
    """Arms whose servers are up together, and the replays run on them, in run order:
    ``(repetition, position in that repetition's order, arm)``."""

    arms: tuple[str, ...]
    replays: tuple[tuple[int, int, str], ...]


class ServerSet(Protocol):
    """What the runner needs from the servers of one pool fraction (see the module doc).

    ``argv`` and ``layouts`` map an arm to its servers' command lines and CPUs per role
    (None: not pinned); ``ports`` are the replicas' ports (empty: one server per arm).
    """

    plan: ArmPlan
    argv: dict[str, list[str]]
    layouts: dict[str, Any]
    ports: Sequence[int]

    def stages(self, arms: Sequence[str], reps: int, rng: random.Random) -> list[Stage]:
        """The run order of ``reps`` repetitions of ``arms`` (drawn from ``rng``)."""
        ...

    def start(self, arms: Sequence[str]) -> None:
        """Start the servers of one stage's ``arms``."""
        ...

    def server(self, arm: str) -> Any:
        """What ``arm``'s replays talk to (a Server, or a ReplicaSet's router)."""
        ...

    def client_cpus(self, arm: str) -> list[int] | None:
        """The CPUs the client runs on while talking to ``arm`` (None: anywhere)."""
        ...

    def calibrate(self, arm: str, plan: CalibrationPlan) -> dict[str, Any]:
        """Measure the testbed's costs on ``arm``'s server."""
        ...

    def cold(self, arm: str) -> str:
        """Empty ``arm``'s cache; return how (``fresh``, ``reset``, ``restart``)."""
        ...

    def release(self, arm: str) -> None:
        """``arm`` has run every replay of its stage."""
        ...

    def stop_all(self) -> None:
        """Stop every server still up."""
        ...


def _reset(url: str) -> bool:
    try:
        r = httpx.post(url + "/reset_prefix_cache", timeout=60.0)
        return r.status_code == 200 and bool(r.json().get("success"))
    except (httpx.HTTPError, ValueError):
        return False


def reset_caches(urls: Sequence[str]) -> bool:
    """``/reset_prefix_cache`` on every server of ``urls`` (each one is asked, even after
    a refusal); True when every one emptied its cache."""
    return all([_reset(url) for url in urls])


class BaseServerSet:
    """What both sets share: the servers by arm, which caches are fresh, the cold-cache
    sequence and the testbed measurement.

    A set says how an arm's servers come up (:meth:`_launch`, which records the server
    in ``servers``, its command line in ``argv`` and, when it starts with an empty cache,
    the arm in ``fresh``), how they restart when a reset is refused (:meth:`_restart`)
    and which server the testbed is measured on (:meth:`_testbed_target`).
    """

    ports: Sequence[int] = ()

    def __init__(
        self,
        cfg: Any,
        plan: ArmPlan,
        options: Callable[[str], dict[str, Any]],
        notify: Notify,
    ) -> None:
        self.cfg, self.plan, self.options, self.notify = cfg, plan, options, notify
        self.servers: dict[str, Any] = {}
        self.fresh: set[str] = set()
        self.argv: dict[str, list[str]] = {}
        self.layouts: dict[str, Any] = {}

    def server(self, arm: str) -> Any:
        """What ``arm``'s replays talk to."""
        return self.servers[arm]

    def client_cpus(self, arm: str) -> list[int] | None:
        """The CPUs the client runs on while talking to ``arm`` (None: anywhere)."""
        return None

    def _start_one(self, arm: str) -> None:
        self.notify("server_starting", {"arm": arm})
        t0 = time.monotonic()
        self._launch(arm)
        self.notify("server_ready", {"arm": arm, "startup_s": time.monotonic() - t0})

    def _launch(self, arm: str) -> None:
        raise NotImplementedError

    def _restart(self, arm: str) -> None:
        raise NotImplementedError

    def _testbed_target(self, arm: str, plan: CalibrationPlan) -> tuple[Any, CalibrationPlan]:
        raise NotImplementedError

    def calibrate(self, arm: str, plan: CalibrationPlan) -> dict[str, Any]:
        """Measure the testbed's costs on ``arm``'s server; its next replay resets the cache."""
        target, plan = self._testbed_target(arm, plan)
        with pinned(self.client_cpus(arm)):
            result = measure_server(target, plan)
        self.fresh.discard(arm)
        self.notify("testbed", {"arm": arm, **result})
        return result

    def cold(self, arm: str) -> str:
        """Empty ``arm``'s cache; return how (``fresh``, ``reset``, ``restart``)."""
        if arm in self.fresh:
            self.fresh.discard(arm)
            return "fresh"
        if reset_caches(server_urls(self.servers[arm])):
            return "reset"
        self.notify("server_restart", {"arm": arm})
        self._restart(arm)
        self.fresh.discard(arm)
        return "restart"


def _stop(server: Any) -> None:
    try:
        server.stop()
    except Exception as exc:  # stopping must not hide the run's own error
        _log.warning("could not stop a bench server: %s", exc)


class ArmServers(BaseServerSet):
    """One server per arm of a pool fraction, all up together (see the module doc)."""

    def __init__(
        self,
        cfg: Any,
        plan: ArmPlan,
        options: Callable[[str], dict[str, Any]],
        notify: Notify,
        platform: PlatformInfo,
    ) -> None:
        super().__init__(cfg, plan, options, notify)
        self.platform = platform

    def stages(self, arms: Sequence[str], reps: int, rng: random.Random) -> list[Stage]:
        """Every arm in one stage; each repetition visits them in a new shuffled order."""
        replays: list[tuple[int, int, str]] = []
        for rep in range(reps):
            order = list(arms)
            rng.shuffle(order)
            replays += [(rep, position, arm) for position, arm in enumerate(order)]
        return [Stage(tuple(arms), tuple(replays))]

    def start(self, arms: Sequence[str]) -> None:
        """Start every arm's server, several at a time; on a failure stop them all."""
        with ThreadPoolExecutor(max_workers=max(1, self.cfg.max_parallel_starts)) as pool:
            futures = [pool.submit(self._start_one, a) for a in arms]
            errors = [f.exception() for f in futures]
        bad = [e for e in errors if e is not None]
        if bad:
            self.stop_all()
            raise bad[0]

    def _launch(self, arm: str) -> None:
        from agentkv.vllm._serve import serve

        server = serve(
            self.cfg.model,
            timeout_s=self.cfg.startup_timeout_s,
            progress=None,
            **self.options(arm),
        )
        self.servers[arm] = server
        self.fresh.add(arm)
        self.argv[arm] = server.profile.to_argv()
        if self.platform.name == "cpu" and self.cfg.cpu_layout == "split":
            self.layouts[arm] = apply_cpu_layout(server.process.pid)

    def client_cpus(self, arm: str) -> list[int] | None:
        """The client's CPUs of ``arm``'s CPU layout (None: not pinned)."""
        layout = self.layouts.get(arm)
        return layout["client"] if layout else None

    def _testbed_target(self, arm: str, plan: CalibrationPlan) -> tuple[Any, CalibrationPlan]:
        return self.servers[arm], plan

    def _restart(self, arm: str) -> None:
        self.servers.pop(arm).stop()
        self._start_one(arm)

    def release(self, arm: str) -> None:
        """``arm`` is done: its server stops."""
        server = self.servers.pop(arm, None)
        if server is not None:
            _stop(server)

    def stop_all(self) -> None:
        """Stop every arm's server (a failure to stop one is logged, never raised)."""
        for server in self.servers.values():
            _stop(server)
        self.servers.clear()
