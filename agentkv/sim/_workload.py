"""Workloads for the simulator: from agentkv trace files, or synthesized at any scale.

A workload is a tuple of :class:`SimTrajectory`. Each turn keeps what the simulator
needs: prompt and output tokens, the tokens it shares with the previous turn's context
(prompt plus answer), the tool its answer called and the idle gap before the next call.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass

from agentkv._errors import TraceFormatError
from agentkv.sim._config import SimCost
from agentkv.traces import Trace
from agentkv.workload._pool import plan_pool
from agentkv.workload._workload import Scaling, Workload, make_workload

__all__ = [
    "SimTrajectory",
    "SimTurn",
    "bench_pool_blocks",
    "from_trace",
    "from_workload",
    "max_request_blocks",
    "reusable_tokens",
    "reuse_ceiling_tokens",
    "stable_arrival_rate",
    "synthesize",
]


@dataclass(frozen=True, slots=True)
class SimTurn:
    """One model call: token counts, the reusable prefix, the tool and the idle gap after it."""

    prompt_tokens: int
    output_tokens: int
    shared_tokens: int  # prefix shared with the previous turn's prompt + answer (0 on turn 0)
    tool_class: str | None
    gap_s: float | None  # answer -> next call; None on the last turn


@dataclass(frozen=True, slots=True)
class SimTrajectory:
    """One agent run: an id, when its first call arrives, and its turns."""

    trajectory_id: str
    start_s: float
    turns: tuple[SimTurn, ...]


def _start_times(n: int, rate_per_s: float | None, seed: int) -> list[float]:
    if rate_per_s is None:
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate_per_s)
    return out


def from_workload(
    workload: Workload, *, arrival_rate_per_s: float | None = 0.5, seed: int = 0
) -> tuple[SimTrajectory, ...]:
    """The simulator's form of a bench :class:`~agentkv.workload.Workload`.

    The same trajectories, turns, token and time scaling as ``agentkv bench`` replays.
    Start times (used by open-loop runs) are a Poisson process of ``arrival_rate_per_s``
    (seeded), in order; ``None`` starts them all at time 0. Closed-loop runs
    (``SimConfig(arrival="closed")``) ignore start times.
    """
    starts = _start_times(len(workload.trajectories), arrival_rate_per_s, seed)
    out = []
    for traj, start in zip(workload.trajectories, starts, strict=True):
        turns = tuple(
            SimTurn(
                t.prompt_tokens, t.output_tokens, t.shared_prefix_tokens, t.tool_name, t.tool_gap_s
            )
            for t in traj.turns
        )
        out.append(SimTrajectory(f"t{traj.traj_idx}", start, turns))
    return tuple(out)


def from_trace(
    trace: Trace,
    *,
    arrival_rate_per_s: float | None = 0.5,
    seed: int = 0,
    scaling: Scaling | None = None,
) -> tuple[SimTrajectory, ...]:
    """Turn a loaded trace into a workload (trajectories without token counts are skipped).

    ``scaling`` cuts and scales it exactly as ``agentkv bench`` does (default: as
    recorded). Within a trajectory each call follows the previous answer after the
    recorded ``tool_gap_s`` (negative gaps were clamped to 0 by the loader).
    """
    if not trace.with_tokens().trajectories:
        raise TraceFormatError(
            f"{trace.source or 'trace'}: no trajectory has token counts; the simulator needs "
            "prompt_tokens, output_tokens and shared_prefix_tokens_with_previous_turn"
        )
    workload = make_workload(trace, scaling or Scaling())
    return from_workload(workload, arrival_rate_per_s=arrival_rate_per_s, seed=seed)


def bench_pool_blocks(
    workload: Workload, concurrency: int, pool_fraction: float, block_size: int
) -> int:
    """The KV pool ``agentkv bench`` gives this workload at ``pool_fraction`` (blocks).

    The bench sizes the pool from the ``concurrency`` largest trajectories' peak
    contexts, raised to hold the longest context; use it as ``SimConfig.pool_blocks``
    so that a pool fraction means the same in both tools.
    """
    working_set = workload.working_set_tokens(concurrency)
    plan, _ = plan_pool(working_set, pool_fraction, workload.max_context_tokens, block_size)
    return plan.pool_blocks


def synthesize(
    num_trajectories: int,
    turns_per_trajectory: int,
    *,
    seed: int = 0,
    arrival_rate_per_s: float | None = 10.0,
    system_prompt_tokens: int = 2000,
    compaction_every: int = 0,
) -> tuple[SimTrajectory, ...]:
    """A deterministic coding-agent-like workload of any size.

    Each turn appends a tool result (log-normal, ~300 tokens) to the previous prompt and
    answer (~150 tokens); gaps are heavy-tailed (most well under a second, a few tens of
    seconds) and depend on the tool class. ``compaction_every`` > 0 rewrites the history
    every that many turns (a prefix break).
    """
    rng = random.Random(seed)
    tools = (("execute_bash", 1.2), ("str_replace_editor", 0.15), ("think", 0.02), ("search", 3.0))
    starts = _start_times(num_trajectories, arrival_rate_per_s, seed + 1)
    out = []
    for j in range(num_trajectories):
        turns = []
        ctx = 0
        for i in range(turns_per_trajectory):
            last = i == turns_per_trajectory - 1
            if i == 0:
                prompt, shared = system_prompt_tokens + int(rng.lognormvariate(5.5, 0.6)), 0
            elif compaction_every and i % compaction_every == 0:
                shared = system_prompt_tokens
                prompt = system_prompt_tokens + int(rng.lognormvariate(7.0, 0.3))
            else:
                shared = ctx
                prompt = ctx + int(rng.lognormvariate(5.5, 0.8))
            output = 20 + int(rng.lognormvariate(4.6, 0.7))
            tool, median_s = tools[rng.randrange(len(tools))]
            gap = None if last else median_s * rng.lognormvariate(0.0, 1.0)
            turns.append(SimTurn(prompt, output, shared, None if last else tool, gap))
            ctx = prompt + output
        out.append(SimTrajectory(f"s{j}", starts[j], tuple(turns)))
    return tuple(out)


def stable_arrival_rate(
    workload: Iterable[SimTrajectory], cost: SimCost, utilization: float = 0.5
) -> float:
    """A Poisson start rate (trajectories/s) that keeps the simulated server ``utilization``
    busy even if nothing were cached and every call decoded alone: it cannot saturate."""
    trajs = list(workload)
    work = [
        sum(cost.prefill_s(t.prompt_tokens) + cost.decode_s(t.output_tokens) for t in tr.turns)
        for tr in trajs
    ]
    mean = sum(work) / max(1, len(work))
    return utilization / mean if mean > 0 else 1.0


def reusable_tokens(workload: Iterable[SimTrajectory]) -> int:
    """Prompt tokens that a perfect cache could serve (the shared prefixes, token-exact)."""
    return sum(t.shared_tokens for traj in workload for t in traj.turns)


def reuse_ceiling_tokens(workload: Iterable[SimTrajectory], block_size: int) -> int:
    """The most a block cache can serve: shared prefixes in whole blocks, below the prompt end.

    vLLM hits whole blocks only, never the prompt's last token, and holds KV for all of
    the previous context but its last sampled token.
    """
    total = 0
    for traj in workload:
        prev_ctx = 0
        for t in traj.turns:
            cap = (t.prompt_tokens - 1) // block_size if t.prompt_tokens > 0 else 0
            held = max(0, prev_ctx - 1) // block_size
            total += min(t.shared_tokens // block_size, cap, held) * block_size
            prev_ctx = t.prompt_tokens + t.output_tokens
    return total


def max_request_blocks(workload: Iterable[SimTrajectory], block_size: int) -> int:
    """Blocks the largest single call needs (prompt plus answer)."""
    return max(
        math.ceil((t.prompt_tokens + t.output_tokens) / block_size)
        for traj in workload
        for t in traj.turns
    )
