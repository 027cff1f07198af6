"""agentkv.sim: a discrete-event KV-cache simulator for agent workloads.

It answers what one real server cannot: hundreds of concurrent trajectories, GPU-sized
pools, a lower (CPU) tier, several replicas, and how far each residency policy sits from
the best possible one (a Belady oracle). Pools follow vLLM's block semantics; the
``agentkv`` policy runs the SDK's own :class:`agentkv.GapModel` and
:class:`agentkv.Advisor`.

>>> from agentkv.sim import SimConfig, simulate, synthesize
>>> workload = synthesize(20, 10, seed=1)
>>> sorted(simulate(workload, SimConfig(pool_fraction=0.3), ["lru", "oracle"]))
['lru', 'oracle']
"""

from __future__ import annotations

from agentkv.sim._calibrate import Calibration, calibrate, fit_calibration
from agentkv.sim._config import (
    ArrivalProcess,
    QueueOrder,
    Routing,
    SimConfig,
    SimCost,
    TierConfig,
)
from agentkv.sim._engine import RunStats, run_policy, size_pool, working_set_blocks
from agentkv.sim._policies import (
    POLICIES,
    Action,
    AgentKVLeasePolicy,
    AgentKVOraclePolicy,
    AgentKVPolicy,
    InferCeptPolicy,
    KVFlowPolicy,
    LRUPolicy,
    OraclePolicy,
    Policy,
    TTLFixedPolicy,
    TurnView,
    make_policy,
)
from agentkv.sim._pool import (
    BlockPool,
    KeyChain,
    LowerTier,
    LRUBlockPool,
    PriorityBlockPool,
    make_pool,
)
from agentkv.sim._report import (
    find_elbow,
    percentile,
    plot_results,
    simulate,
    summarize,
    sweep,
    write_results,
)
from agentkv.sim._routing import Router
from agentkv.sim._workload import (
    SimTrajectory,
    SimTurn,
    bench_pool_blocks,
    from_trace,
    from_workload,
    max_request_blocks,
    reusable_tokens,
    reuse_ceiling_tokens,
    synthesize,
)

__all__ = [
    "POLICIES",
    "Action",
    "AgentKVLeasePolicy",
    "AgentKVOraclePolicy",
    "AgentKVPolicy",
    "ArrivalProcess",
    "BlockPool",
    "Calibration",
    "InferCeptPolicy",
    "KVFlowPolicy",
    "KeyChain",
    "LRUBlockPool",
    "LRUPolicy",
    "LowerTier",
    "OraclePolicy",
    "Policy",
    "PriorityBlockPool",
    "QueueOrder",
    "Router",
    "Routing",
    "RunStats",
    "SimConfig",
    "SimCost",
    "SimTrajectory",
    "SimTurn",
    "TTLFixedPolicy",
    "TierConfig",
    "TurnView",
    "bench_pool_blocks",
    "calibrate",
    "find_elbow",
    "fit_calibration",
    "from_trace",
    "from_workload",
    "make_policy",
    "make_pool",
    "max_request_blocks",
    "percentile",
    "plot_results",
    "reusable_tokens",
    "reuse_ceiling_tokens",
    "run_policy",
    "simulate",
    "size_pool",
    "summarize",
    "sweep",
    "synthesize",
    "working_set_blocks",
    "write_results",
]
