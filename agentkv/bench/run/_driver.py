"""Replay drivers: trajectories through the product, against a live server.

Every replayed trajectory runs inside :func:`agentkv.trajectory`; every turn is a
token-id completion sent through a client wrapped by :func:`agentkv.wrap_openai` (so the
hints, lifecycle events and turn records are the product's own); every tool gap is a
sleep inside :func:`agentkv.tool_call` named after the trace's tool. The output length
is exact (``max_tokens`` with ``min_tokens`` and ``ignore_eos``), and the answer's token
ids are read back (``return_token_ids``) so the next prompt can extend it.

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
from agentkv.bench.testbed._servedby import SERVED_BY_HEADER
from agentkv.events._context import trajectory
from agentkv.events._decorators import tool_call
from agentkv.workload._arrival import Arrival
from agentkv.workload._workload import PlannedTrajectory, Workload, eligible_prefix_tokens

__all__ = [
    "ReplayResult",
    "TrajectoryResult",
    "TurnResult",
    "one_turn",
    "replay",
    "wrap_client",
]

_log = logging.getLogger("agentkv")

#: Tokens per streamed chunk after the first (vLLM's per-request ``stream_interval``).
#: The first token and the last chunk are sent at once, so TTFT and the answer are
#: unchanged; batching the rest spares the API server and the client a chunk per token.
STREAM_INTERVAL = 16


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
    served_by: str | None = None  # the answering replica's port (router mode, bench.testbed._servedby)
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


def wrap_client(client: Any, options: Mapping[str, Any] | None = None) -> tuple[Any, bool]:
    """``client`` wrapped by ``agentkv.wrap_openai`` for vLLM with ``options`` (extra
    :class:`~agentkv.ClientOptions` fields) and True, or as it is and False."""
    try:
        from agentkv.client._options import ClientOptions
        from agentkv.client._wrap import wrap_openai as wrap
    except ImportError as exc:  # client wrapper not installed yet
        _log.warning("agentkv.wrap_openai is unavailable (%s); replaying without hints", exc)
        return client, False
    return wrap(client, options=ClientOptions(backend="vllm", **(options or {}))), True


async def one_turn(
    client: Any, model: str, prompt: list[int], out_tokens: int
) -> tuple[list[int], int | None, float | None, str | None]:
    """Send one streamed completion; return (answer ids, cached tokens, ttft, served by).

    ``served by``: the response's :data:`~agentkv.bench.testbed._servedby.SERVED_BY_HEADER`
    (the replica's port, when the servers run that middleware), else None.

    The token ids travel in ``extra_body``, which the openai client sends as is: passed
    as ``prompt`` they go through its type-directed transform one int at a time, which
    costs ~20 µs per token (~0.16 s of client CPU for an 8k-token prompt, ten times what
    the API server spends on the turn). The request on the wire is the same.
    """
    t0 = time.monotonic()
    stream = await client.completions.create(
        model=model,
        prompt=[],  # replaced by extra_body["prompt"]
        max_tokens=out_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={
            "prompt": prompt,
            "min_tokens": out_tokens,
            "ignore_eos": True,
            "return_token_ids": True,
            "stream_interval": STREAM_INTERVAL,
        },
    )
    ids: list[int] = []
    ttft: float | None = None
    cached: int | None = None
    response = getattr(stream, "response", None)
    served_by = response.headers.get(SERVED_BY_HEADER) if response is not None else None
    async for chunk in stream:
        if chunk.choices:
            if ttft is None:
                ttft = time.monotonic() - t0
            extra = getattr(chunk.choices[0], "token_ids", None)
            if extra is None and chunk.choices[0].model_extra:
                extra = chunk.choices[0].model_extra.get("token_ids")
            if extra:
                ids.extend(int(x) for x in extra)
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            details = getattr(usage, "prompt_tokens_details", None)
            if details is not None and getattr(details, "cached_tokens", None) is not None:
                cached = int(details.cached_tokens)
    return ids, cached, ttft, served_by


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
