"""The benchmark protocol: servers per arm, cold caches, randomized repetitions.

For each pool fraction, every runnable arm gets servers with the same KV pool memory and
``max_model_len``, except the limit arm L, whose pool holds the whole workload
(:func:`~agentkv.workload._pool.plan_limit`); L runs at the first pool fraction only,
since its pool does not depend on the fraction. The servers are a
:class:`~agentkv.bench.run._servers.ServerSet`: one server per arm, started together,
each repetition visiting the arms in a freshly shuffled order; or, in router mode, N
replicas per arm behind vllm-router, the arms one after another in a shuffled order.
One pool runner drives either. Before every replay the arm's cache is emptied (a fresh
server, or ``/reset_prefix_cache``, which also drops the plugin's leases; a reset the
server refuses restarts it instead), and the emptiness is checked: in a cold cache no
trajectory's first prompt can hit (beyond a common system prefix), so every repetition
records ``cold_verified``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol, cast

from agentkv._errors import ConfigError, ServeError
from agentkv.bench.run._arms import (
    ROUTER_SCHEDULED_ARMS,
    arm_description,
    arm_options,
    arm_unavailable,
    uses_fp8,
)
from agentkv.bench.run._driver import ReplayResult, replay
from agentkv.bench.run._gapscale import GapScaleRule, measured_prefill_rate
from agentkv.bench.run._replicas import ReplicaServers, check_routing, client_options
from agentkv.bench.run._servers import ArmServers, ServerSet
from agentkv.bench.run._synth import PromptSynthesizer
from agentkv.bench.testbed._costs import ProcessSampler, load_average
from agentkv.bench.testbed._cpulayout import CPU_LAYOUTS, pinned
from agentkv.bench.testbed._probe import CalibrationPlan
from agentkv.bench.testbed._scrape import counters_delta, get_placement, read_counters
from agentkv.bench.testbed._servedby import call_replicas
from agentkv.events._config import configure
from agentkv.traces import Trace, load_trace
from agentkv.vllm._control import STATS_MAX_AGE_S
from agentkv.vllm._platform import PlatformInfo
from agentkv.workload._arrival import Arrival
from agentkv.workload._pool import ArmPlan, plan_limit, plan_pool
from agentkv.workload._warm import GapWarmup, load_warm_trace, make_warmup
from agentkv.workload._workload import Scaling, Workload, make_workload

__all__ = ["BenchConfig", "PoolRun", "RepResult", "ReplayOnce", "run_bench", "run_pool"]

_log = logging.getLogger("agentkv")


@dataclass(frozen=True)
class BenchConfig:
    """Everything one ``agentkv bench`` run needs (recorded in the manifest)."""

    trace_path: str
    arms: tuple[str, ...] = ("B", "E", "F", "G", "L")
    reps: int = 5
    pool_fractions: tuple[float, ...] = (0.5,)
    scaling: Scaling = field(default_factory=Scaling)
    arrival: Arrival = field(default_factory=Arrival)
    seed: int = 0
    out_dir: str = "agentkv-bench"
    block_size: int = 32
    model: str | None = None
    # None: each server's KV space is sized from its pool (what `agentkv serve` does)
    cpu_memory_fraction: float | None = None
    startup_timeout_s: float = 900.0
    max_parallel_starts: int = 3
    extra_serve_options: dict[str, Any] = field(default_factory=dict)
    warm_gaps: str = "train"  # how each replay's gap model starts (workload._warm)
    warm_from: str | None = None  # another trace whose gaps the gap model learns first
    replicas: int = 1
    routing: str = "session"
    measure_testbed: bool = True  # each server's own costs, right after it starts
    cpu_layout: str = "split"  # CPU build: see bench.testbed._cpulayout
    # Set: the tool gaps' time scale is chosen from the first servers' measured prefill
    # rate (bench.run._gapscale), replacing scaling.time_scale; needs measure_testbed.
    gap_scale: GapScaleRule | None = None

    def __post_init__(self) -> None:
        if self.reps < 1:
            raise ConfigError("reps must be at least 1")
        if self.cpu_layout not in CPU_LAYOUTS:
            raise ConfigError(
                f"cpu_layout must be one of {', '.join(CPU_LAYOUTS)}, got {self.cpu_layout!r}"
            )
        if not self.pool_fractions:
            raise ConfigError("give at least one pool fraction")
        bad = [f for f in self.pool_fractions if not (isinstance(f, int | float) and f > 0)]
        if bad:
            raise ConfigError(f"pool fractions must be above 0, got {bad}")
        if self.replicas < 1:
            raise ConfigError("replicas must be at least 1")
        check_routing(self.routing, self.arms)
        if self.gap_scale is not None and not self.measure_testbed:
            raise ConfigError("gap_scale needs measure_testbed: it reads the measured prefill rate")

    def router_mode(self) -> bool:
        """True when every arm runs behind vllm-router (replicas > 1, or an R arm)."""
        return self.replicas > 1 or any(a in ROUTER_SCHEDULED_ARMS for a in self.arms)


@dataclass
class RepResult:
    """One arm-repetition at one pool fraction."""

    arm: str
    rep: int
    pool_fraction: float
    order: int
    replay: ReplayResult
    vllm: dict[str, float]
    agentkv: dict[str, float]
    cold_verified: bool
    cache_reset: str
    per_replica: list[dict[str, Any]] = field(default_factory=list)  # router mode only
    router: dict[str, float] = field(default_factory=dict)  # the router's own counters
    placement: dict[str, int] = field(default_factory=dict)  # trajectory id -> replica
    call_replicas: dict[str, int] = field(default_factory=dict)  # "traj/turn" -> replica
    processes: dict[str, Any] | None = None  # CPU and run-queue waits per role (testbed._costs)


Progress = Callable[[str, dict[str, Any]], None]


def _vocab(model_dir: str | None) -> tuple[int, int]:
    if model_dir is None:
        return 16, 2048
    cfg = Path(model_dir) / "config.json"
    try:
        size = int(json.loads(cfg.read_text("utf-8"))["vocab_size"])
    except (OSError, ValueError, KeyError):
        return 16, 2048
    return (16 if size > 64 else 1), size


def _cold_ok(result: ReplayResult, synth: PromptSynthesizer, block_size: int) -> bool:
    allowed = synth.system_prefix_tokens // block_size * block_size
    for traj in result.trajectories:
        first = traj.turns[0] if traj.turns else None
        if first is None or first.cached_tokens is None or first.cached_tokens > allowed:
            return False
    return True


def serve_options(
    arm: str,
    plan: ArmPlan,
    platform: PlatformInfo,
    *,
    cpu_memory_fraction: float | None,
    extra: dict[str, Any],
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """Every server option of ``arm``: the arm's profile plus the bench's own (eager, the
    served name, dev-mode routes, the CPU build's memory share, ``extra_args`` for vLLM),
    then the run's ``extra`` options over them."""
    opts = arm_options(arm, plan, platform)
    opts.update(
        enforce_eager=True,
        served_model_name="agentkv-bench",
        extra_env={"VLLM_SERVER_DEV_MODE": "1"},
    )
    if extra_args:
        opts["extra_args"] = list(extra_args)
    if platform.name == "cpu" and cpu_memory_fraction is not None:
        opts["gpu_memory_utilization"] = cpu_memory_fraction
    opts.update(extra)
    return opts


@dataclass
class _Setup:
    """What every replay of one run shares: the workload, prompts and where it runs."""

    cfg: BenchConfig
    trace: Trace
    workload: Workload
    synth: PromptSynthesizer
    platform: PlatformInfo
    model_dir: str | None
    emit: Progress
    warmup: GapWarmup
    warm_trace: Trace | None = None  # the --warm-from trace, kept for a later rescale


def _prepare(cfg: BenchConfig, emit: Progress) -> _Setup:
    """Load the trace, shape the workload, find the model and its vocabulary."""
    from agentkv.vllm._platform import detect_platform

    trace = load_trace(cfg.trace_path)
    warm_trace = load_warm_trace(cfg.trace_path, cfg.warm_from, cfg.warm_gaps)
    workload: Workload = make_workload(trace, cfg.scaling)
    platform = detect_platform()
    if cfg.model is None:
        from agentkv.models import ensure_tiny_model

        model_dir: str | None = str(ensure_tiny_model())
    else:
        model_dir = cfg.model if Path(cfg.model).is_dir() else None
    lo, hi = _vocab(model_dir)
    synth = PromptSynthesizer(
        seed=cfg.seed,
        vocab_low=lo,
        vocab_high=hi,
        system_prefix_tokens=cfg.scaling.system_prefix_tokens,
    )
    warmup = make_warmup(trace, workload, cfg.warm_gaps, warm_trace, cfg.warm_from)
    return _Setup(cfg, trace, workload, synth, platform, model_dir, emit, warmup, warm_trace)


def _rescale_gaps(run: _Setup, record: dict[str, Any]) -> None:
    """Once, after the first servers' testbed: choose the gaps' time scale from the
    measured prefill rate (``run.cfg.gap_scale``) and rebuild the workload and the gap
    warm-up with it; the choice goes to ``record["gap_scale"]``."""
    rule = run.cfg.gap_scale
    if rule is None or "gap_scale" in record:
        return
    rate = measured_prefill_rate(record["testbed"])
    scaling, why = rule.resolve(run.trace, run.cfg.scaling, rate)
    run.cfg = replace(run.cfg, scaling=scaling)
    run.workload = make_workload(run.trace, scaling)
    run.warmup = make_warmup(
        run.trace, run.workload, run.cfg.warm_gaps, run.warm_trace, run.cfg.warm_from
    )
    record["gap_scale"] = why
    run.emit("gap_scale", why)


def _pool_record(fraction: float, plan: ArmPlan, clamped: bool) -> dict[str, Any]:
    return {
        "pool_fraction": fraction,
        "pool_blocks": plan.pool_blocks,
        "pool_tokens": plan.pool_tokens(),
        "block_size": plan.block_size,
        "max_model_len": plan.max_model_len,
        "raised_to_fit_longest_context": clamped,
    }


def _replay_once(
    run: _Setup, servers: ServerSet, arm: str, rep: int, position: int, fraction: float
) -> RepResult:
    """Empty ``arm``'s cache, replay the workload once, and measure what changed."""
    from agentkv.client import _accounting

    how = servers.cold(arm)
    server = servers.server(arm)
    routed = run.cfg.router_mode()
    run.emit("replay_start", {"arm": arm, "rep": rep, "fraction": fraction})
    before = read_counters(server)
    _accounting.reset()
    configure(gap_model=run.warmup.make_model())  # every replay starts from the same model
    sampler = ProcessSampler(None if routed else server.process.pid)
    load0, p0 = load_average(), sampler.sample()
    with pinned(servers.client_cpus(arm)):
        result = asyncio.run(_replay(run, servers, server, arm, rep, routed))
    usage = ProcessSampler.delta(p0, sampler.sample())
    result.client_stats = _accounting.stats().to_dict()
    # The stats route serves a snapshot up to STATS_MAX_AGE_S old: read one taken after
    # the replay (and after its last lifecycle posts), not one from before it.
    time.sleep(STATS_MAX_AGE_S + 0.1)
    moved = counters_delta(before, read_counters(server))
    ids = [t.trajectory_id for t in result.trajectories if t.trajectory_id]
    measured = RepResult(
        arm=arm,
        rep=rep,
        pool_fraction=fraction,
        order=position,
        replay=result,
        vllm=moved["vllm"],
        agentkv=moved["agentkv"],
        cold_verified=_cold_ok(result, run.synth, servers.plan.block_size),
        cache_reset=how,
        per_replica=moved["replicas"] if routed else [],
        router=moved["router"],
        placement=get_placement(server, ids) if routed and moved["agentkv"] else {},
        call_replicas=call_replicas(result.trajectories, servers.ports) if routed else {},
        processes={
            "turns": sum(len(t.turns) for t in result.trajectories),
            "load_avg_1m": [load0, load_average()],
            **(usage or {}),
        },
    )
    run.emit("replay_done", {"arm": arm, "rep": rep, "wall_s": result.wall_s})
    return measured


def _replay(run: _Setup, servers: ServerSet, server: Any, arm: str, rep: int, routed: bool) -> Any:
    """The replay coroutine of one arm-repetition."""
    return replay(
        server.openai_base_url,
        server.model,
        run.workload,
        run.synth,
        arrival=run.cfg.arrival,
        block_size=servers.plan.block_size,
        on_turn=lambda: run.emit("turn", {}),
        client_options=client_options(arm, run.cfg) if routed else None,
        # Same ids in every arm: same replica for each trajectory (see bench/run/_replicas.py).
        trajectory_id=(lambda i: f"bench-{run.cfg.seed}-{rep}-{i}") if routed else None,
    )


def _measure(run: _Setup, servers: ServerSet, arm: str, key: str, record: dict[str, Any]) -> None:
    """``arm``'s testbed costs into ``record["testbed"][key]``."""
    calibration = CalibrationPlan.for_workload(
        run.workload, servers.plan, run.cfg.arrival, run.synth, run.cfg.seed
    )
    record["testbed"][key] = servers.calibrate(arm, calibration)


def _server_set(run: _Setup, plans: tuple[ArmPlan, ArmPlan]) -> ServerSet:
    """The servers of one pool fraction: replicas behind a router in router mode, else
    one server per arm (L on its own pool)."""
    plan, limit = plans

    def options(arm: str) -> dict[str, Any]:
        return serve_options(
            arm,
            limit if arm == "L" else plan,
            run.platform,
            cpu_memory_fraction=run.cfg.cpu_memory_fraction,
            extra=run.cfg.extra_serve_options,
        )

    if run.cfg.router_mode():
        return ReplicaServers(run.cfg, plan, options, run.emit)
    return ArmServers(run.cfg, plan, options, run.emit, run.platform)


class PoolRun(Protocol):
    """What :func:`run_pool` reads of a run: its configuration (``reps``,
    ``measure_testbed``). A trace replay's run is a :class:`_Setup`."""

    cfg: Any


#: One arm-repetition of a pool: ``(servers, arm, repetition, position) -> result``.
ReplayOnce = Callable[[ServerSet, str, int, int], Any]


def run_pool(
    run: PoolRun,
    servers: ServerSet,
    fraction: float,
    arms: list[str],
    rng: random.Random,
    record: dict[str, dict[str, Any]],
    once: ReplayOnce | None = None,
    measured: Callable[[], None] | None = None,
) -> tuple[list[Any], dict[str, list[str]]]:
    """Every repetition of ``arms`` on this pool, stage by stage (see
    :mod:`agentkv.bench.run._servers`): each arm's testbed costs are measured (into
    ``record["testbed"]``, its CPUs into ``record["cpu_layout"]``, keyed ``ARM@FRACTION``)
    right after its servers start, before its replays (when ``run.cfg.measure_testbed``).

    ``once`` runs one arm-repetition on the arm's emptied cache (default: the trace
    replay of ``run``, a :class:`_Setup`; the live-agent bench passes its own).
    ``measured`` is called after each stage's servers are measured, before its replays."""
    reps: list[Any] = []
    argv: dict[str, list[str]] = {}

    def replay_once(s: ServerSet, arm: str, rep: int, position: int) -> Any:
        if once is not None:
            return once(s, arm, rep, position)
        return _replay_once(cast(_Setup, run), s, arm, rep, position, fraction)

    try:
        for stage in servers.stages(arms, run.cfg.reps, rng):
            servers.start(stage.arms)
            for arm in stage.arms:
                key = f"{arm}@{fraction:g}"
                argv[key] = servers.argv[arm]
                record["cpu_layout"][key] = servers.layouts.get(arm)
                if run.cfg.measure_testbed:
                    _measure(cast(_Setup, run), servers, arm, key, record)
            if measured is not None:
                measured()
            for rep, position, arm in stage.replays:
                reps.append(replay_once(servers, arm, rep, position))
            for arm in stage.arms:
                servers.release(arm)
    finally:
        servers.stop_all()
    return reps, argv


def run_bench(cfg: BenchConfig, notify: Progress | None = None) -> dict[str, Any]:
    """Run the benchmark protocol; return the raw results for :mod:`agentkv.bench.report._report`."""
    run = _prepare(cfg, notify or (lambda kind, data: None))
    workload, platform = run.workload, run.platform
    runnable = [a for a in cfg.arms if arm_unavailable(a, platform) is None]
    not_run = {a: r for a in cfg.arms if (r := arm_unavailable(a, platform)) is not None}
    concurrency = cfg.arrival.effective_concurrency(workload)
    working_set = workload.working_set_tokens(concurrency)
    rng = random.Random(cfg.seed)
    reps: list[RepResult] = []
    pools: list[dict[str, Any]] = []
    argv: dict[str, list[str]] = {}
    record: dict[str, dict[str, Any]] = {"cpu_layout": {}, "testbed": {}}
    per_rep = len(cfg.pool_fractions) * len([a for a in runnable if a != "L"]) + ("L" in runnable)
    total = per_rep * cfg.reps
    run.emit("plan", {"total": total, "turns_per_replay": workload.num_turns, "arms": runnable})
    limit: ArmPlan | None = None
    # Router mode: each replica gets its share of the working set (same total pool).
    share = -(-working_set // cfg.replicas) if cfg.router_mode() else working_set
    for i, fraction in enumerate(cfg.pool_fractions):
        plan, clamped = plan_pool(share, fraction, workload.max_context_tokens, cfg.block_size)
        limit = plan_limit(workload.new_blocks_per_turn(cfg.block_size), concurrency, plan)
        replicas = cfg.replicas if cfg.router_mode() else 1
        pools.append({**_pool_record(fraction, plan, clamped), "replicas": replicas})
        arms = [a for a in runnable if a != "L" or i == 0]
        servers = _server_set(run, (plan, limit))
        pool_reps, pool_argv = run_pool(
            run, servers, fraction, arms, rng, record, measured=lambda: _rescale_gaps(run, record)
        )
        reps += pool_reps
        argv.update(pool_argv)
    if not reps and runnable:
        raise ServeError("no replay completed")
    return {
        "config": run.cfg,
        "workload": run.workload,
        **({"gap_scale": record["gap_scale"]} if "gap_scale" in record else {}),
        "platform": platform.name,
        "model_dir": run.model_dir,
        "working_set_tokens": working_set,
        "concurrency": concurrency,
        "pools": pools,
        "argv": argv,
        "testbed": record["testbed"],
        "cpu_layout": record["cpu_layout"],
        "reps": reps,
        "not_run": not_run,
        "descriptions": {a: arm_description(a, platform, limit) for a in cfg.arms},
        "limit_pool_blocks": limit.pool_blocks if limit is not None else None,
        "fp8_arms": [a for a in runnable if uses_fp8(a, platform)],
        "warmup": run.warmup,
        "replicas": {
            "replicas": cfg.replicas,
            "router": cfg.router_mode(),
            "routing": cfg.routing if cfg.router_mode() else None,
        },
    }
