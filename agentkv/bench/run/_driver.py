"""Replay drivers: trajectories through the product, against a live server.

Every replayed trajectory runs inside :func:`agentkv.trajectory`; every turn is a
token-id completion sent through a client wrapped by :func:`agentkv.wrap_openai` (so the
hints, lifecycle events and turn records are the product's own; the call itself is
:func:`~agentkv.bench.testbed._client.one_turn`); every tool gap is a sleep inside
:func:`agentkv.tool_call` named after the trace's tool. The answer's token ids are read
back so the next prompt can extend it.

Trajectories start as the workload's :class:`~agentkv.workload.Arrival` says: a closed
loop of N in flight, or open-loop Poisson arrivals.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentkv.bench.run._synth import PromptSynthesizer
from agentkv.bench.testbed._client import one_turn, wrap_client
from agentkv.events._context import trajectory
from agentkv.events._decorators import tool_call
from agentkv.workload._arrival import Arrival
from agentkv.workload._workload import PlannedTrajectory, Workload, eligible_prefix_tokens

__all__ = [
    "ReplayResult",
    "TrajectoryResult",
    "TurnResult",
    "replay",
]

_log = logging.getLogger("agentkv")


@dataclass(slots=True)
class TurnResult:
    """What one replayed model call measured."""

    turn: int
    prompt_tokens: int
    output_tokens: int
    shared_prefix_tokens: int
    eligible_prefix_tokens: int  # block-aligned prefix the server could have served
    cached_tokens: int | None
    ttft_s: float | None
    latency_s: float
    ok: bool = True
    served_by: str | None = None  # the answering replica's port (router mode, testbed._servedby)
    sent_s: float | None = None  # when the call was sent, seconds since the replay started


@dataclass(slots=True)
class TrajectoryResult:
    """One replayed trajectory."""

    traj_idx: int
    started_s: float  # since the start of the replay
    jct_s: float  # first request sent -> last answer received (gaps included)
    turns: list[TurnResult] = field(default_factory=list)
    ok: bool = True
    trajectory_id: str | None = None


@dataclass(slots=True)
class ReplayResult:
    """One arm-repetition's replay."""

    trajectories: list[TrajectoryResult]
    wall_s: float
    arrival: Arrival
    client_wrapped: bool
    client_stats: dict[str, Any] | None = None


async def _replay_trajectory(
    client: Any,
    model: str,
    synth: PromptSynthesizer,
    traj: PlannedTrajectory,
    *,
    block_size: int,
    t_origin: float,
    tenant: str,
    on_turn: Callable[[], None],
    trajectory_id: str | None = None,
) -> TrajectoryResult:
    started = time.monotonic()
    result = TrajectoryResult(traj.traj_idx, started - t_origin, 0.0)
    context: list[int] | None = None
    async with trajectory(trajectory_id, tenant=tenant, parent=None) as current:
        result.trajectory_id = current.trajectory_id
        for turn in traj.turns:
            prompt = synth.prompt(traj.traj_idx, turn, context)
            t0 = time.monotonic()
            try:
                ids, cached, ttft, served_by = await one_turn(
                    client, model, prompt, turn.output_tokens
                )
                ok = True
            except Exception as exc:  # a failed call is recorded; the trajectory goes on
                _log.warning("trajectory %d turn %d failed: %s", traj.traj_idx, turn.index, exc)
                ids, cached, ttft, served_by, ok = [], None, None, None, False
            result.turns.append(
                TurnResult(
                    turn=turn.index,
                    prompt_tokens=len(prompt),
                    output_tokens=turn.output_tokens,
                    shared_prefix_tokens=turn.shared_prefix_tokens,
                    eligible_prefix_tokens=eligible_prefix_tokens(
                        turn.shared_prefix_tokens, len(prompt), block_size
                    ),
                    cached_tokens=cached,
                    ttft_s=ttft,
                    latency_s=time.monotonic() - t0,
                    ok=ok,
                    served_by=served_by,
                    sent_s=t0 - t_origin,
                )
            )
            result.ok = result.ok and ok
            on_turn()
            if len(ids) != turn.output_tokens:
                ids = synth.placeholder_output(traj.traj_idx, turn)
            context = prompt + ids
            if turn.tool_gap_s is not None:
                async with tool_call(turn.tool_name or "tool"):
                    await asyncio.sleep(turn.tool_gap_s)
    result.jct_s = time.monotonic() - started
    return result


async def replay(
    base_url: str,
    model: str,
    workload: Workload,
    synth: PromptSynthesizer,
    *,
    arrival: Arrival,
    block_size: int,
    tenant: str = "bench",
    on_turn: Callable[[], None] = lambda: None,
    client_options: Mapping[str, Any] | None = None,
    trajectory_id: Callable[[int], str] | None = None,
) -> ReplayResult:
    """Replay every trajectory of ``workload`` against the server at ``base_url``.

    ``client_options``: extra :class:`~agentkv.ClientOptions` fields of the wrapped client;
    ``trajectory_id``: the id of trajectory ``traj_idx`` (default: a random id).
    """
    from openai import AsyncOpenAI

    raw = AsyncOpenAI(base_url=base_url, api_key="agentkv-bench", max_retries=0, timeout=600.0)
    client, wrapped = wrap_client(raw, client_options)
    t_origin = time.monotonic()
    results: list[TrajectoryResult] = []

    async def run_one(traj: PlannedTrajectory) -> None:
        results.append(
            await _replay_trajectory(
                client,
                model,
                synth,
                traj,
                block_size=block_size,
                t_origin=t_origin,
                tenant=tenant,
                on_turn=on_turn,
                trajectory_id=trajectory_id(traj.traj_idx) if trajectory_id else None,
            )
        )

    try:
        if arrival.process == "poisson":
            rng = random.Random(arrival.seed)
            tasks = []
            for i, traj in enumerate(workload.trajectories):
                if i:
                    await asyncio.sleep(rng.expovariate(arrival.rate_per_s))
                tasks.append(asyncio.create_task(run_one(traj)))
            await asyncio.gather(*tasks)
        else:
            queue = list(workload.trajectories)
            queue.reverse()

            async def worker() -> None:
                while queue:
                    await run_one(queue.pop())

            await asyncio.gather(*(worker() for _ in range(max(1, arrival.concurrency))))
    finally:
        await raw.close()
    results.sort(key=lambda r: r.traj_idx)
    return ReplayResult(results, time.monotonic() - t_origin, arrival, wrapped)
