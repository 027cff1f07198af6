"""The testbed's calibration requests, sent to a running server through the bench's own
client path (see :mod:`agentkv.bench.testbed._costs` for what each figure means)."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentkv.bench.testbed._client import one_turn, wrap_client
from agentkv.bench.testbed._costs import (
    CallTiming,
    ProcessSampler,
    compute_decode_step_s,
    compute_histogram_means,
    compute_prefill_tokens_per_s,
    compute_turn_split,
    engine_decode_step_s,
    load_average,
)
from agentkv.bench.testbed._scrape import get_vllm_metrics_raw
from agentkv.workload._arrival import Arrival
from agentkv.workload._pool import ArmPlan
from agentkv.workload._workload import Workload

__all__ = ["CalibrationPlan", "measure_server", "measure_testbed"]


@dataclass(frozen=True, slots=True)
class CalibrationPlan:
    """Sizes of the calibration requests (derived from the workload and the server)."""

    block_size: int
    max_model_len: int
    concurrency: int
    context_tokens: int  # the workload's typical prompt
    vocab_low: int = 16
    vocab_high: int = 2048
    fixed_turn_calls: int = 8
    long_turn_calls: int = 3
    decode_tokens: int = 32
    seed: int = 0

    @classmethod
    def for_workload(
        cls, workload: Workload, plan: ArmPlan, arrival: Arrival, synth: Any, seed: int
    ) -> CalibrationPlan:
        """Sizes for ``workload`` on a server of ``plan`` (the mean prompt as the context,
        the run's concurrency as the decode batch, ``synth``'s vocabulary)."""
        return cls(
            block_size=plan.block_size,
            max_model_len=plan.max_model_len,
            concurrency=arrival.effective_concurrency(workload),
            context_tokens=workload.total_prompt_tokens // max(1, workload.num_turns),
            vocab_low=synth.vocab_low,
            vocab_high=synth.vocab_high,
            seed=seed,
        )

    def cached_tokens(self, target: int) -> int:
        """A prompt length whose every token but the last sits in whole cached blocks."""
        room = self.max_model_len - self.decode_tokens - 1
        blocks = max(1, min(target, room - 1) // self.block_size)
        return blocks * self.block_size + 1

    def new_tokens_at_context(self, context_tokens: int) -> int:
        """Fresh tokens appended to the cached context (fits ``max_model_len``)."""
        return max(1, min(512, self.max_model_len - context_tokens - 2))

    def fresh_lengths(self) -> tuple[int, int]:
        """Two uncached prompt lengths for the prefill rate."""
        room = self.max_model_len - 2
        long = max(64, min(2048, room))
        return max(16, long // 4), long


@dataclass
class _Probe:
    """One calibration session: the client, the server's processes, fresh prompts."""

    client: Any
    model: str
    base_url: str
    procs: ProcessSampler
    fresh: Callable[[int], list[int]]

    async def turn(self, prompt: list[int], k: int) -> CallTiming:
        t0 = time.monotonic()
        ids, cached, ttft, _ = await one_turn(self.client, self.model, prompt, k)
        return CallTiming(ttft, time.monotonic() - t0, len(ids) or k, cached)

    async def series(self, prompt: list[int], n: int) -> dict[str, Any]:
        """``n`` one-token calls of a cached ``prompt``, one at a time, split by role."""
        m0 = get_vllm_metrics_raw(self.base_url)
        p0 = self.procs.sample()
        calls = [await self.turn(prompt, 1) for _ in range(n)]
        p1 = self.procs.sample()
        server = compute_histogram_means(m0, get_vllm_metrics_raw(self.base_url))
        p50 = _p50(calls)
        usage = ProcessSampler.delta(p0, p1, per=n)
        ttfts = [c.ttft_s for c in calls if c.ttft_s is not None]
        return {
            "prompt_tokens": len(prompt),
            "cached_tokens": calls[-1].cached_tokens,
            "calls": n,
            "client_ttft_s_p50": p50,
            "client_ttft_s_mean": statistics.fmean(ttfts) if ttfts else None,
            "server": server,
            "split": compute_turn_split(p50, server) if p50 is not None else None,
            "cpu_s_per_turn": usage["cpu_s"] if usage else None,
            "runqueue_wait_s_per_turn": usage["runqueue_wait_s"] if usage else None,
        }

    async def prefill(
        self, plan: CalibrationPlan, long: list[int], t_cached: Any
    ) -> dict[str, Any]:
        """Marginal prefill rate on fresh prompts, and of new tokens on a cached context."""
        n_short, n_long = plan.fresh_lengths()
        shorts = [await self.turn(self.fresh(n_short), 1) for _ in range(2)]
        longs = [await self.turn(self.fresh(n_long), 1) for _ in range(2)]
        t_short, t_long = _p50(shorts), _p50(longs)
        # New tokens on top of the workload's cached context: what a resumed turn computes.
        n_new = plan.new_tokens_at_context(len(long))
        at_ctx = [await self.turn(long[:-1] + self.fresh(n_new + 1), 1) for _ in range(2)]
        t_ctx = _p50(at_ctx)
        return {
            "tokens": [n_short, n_long],
            "ttft_s": [t_short, t_long],
            "tokens_per_s": compute_prefill_tokens_per_s(n_short, t_short, n_long, t_long)
            if t_short is not None and t_long is not None
            else None,
            "at_context_tokens": len(long) - 1,
            "at_context_new_tokens": n_new,
            "at_context_ttft_s": t_ctx,
            "at_context_tokens_per_s": compute_prefill_tokens_per_s(1, t_cached, n_new + 1, t_ctx)
            if t_ctx is not None and t_cached is not None
            else None,
        }

    async def decode(
        self, plan: CalibrationPlan, short: list[int], long: list[int]
    ) -> dict[str, Any]:
        """Decode step time: short prompt at batch 1, long context at batch 1 and N (the
        engine's own inter-token latency where vLLM reports it, else the client's; both
        are kept, see :func:`~agentkv.bench.testbed._costs.engine_decode_step_s`)."""
        k = plan.decode_tokens
        m0 = get_vllm_metrics_raw(self.base_url)
        b1 = [await self.turn(short, k) for _ in range(2)]
        m1 = get_vllm_metrics_raw(self.base_url)
        b1_ctx = [await self.turn(long, k) for _ in range(2)]
        m2 = get_vllm_metrics_raw(self.base_url)
        n = max(1, plan.concurrency)
        bn = await asyncio.gather(*(self.turn(long, k) for _ in range(n)))
        m3 = get_vllm_metrics_raw(self.base_url)
        itl = [compute_histogram_means(a, b)["itl_s"] for a, b in ((m0, m1), (m1, m2), (m2, m3))]
        steps = [engine_decode_step_s(i, c) for i, c in zip(itl, (b1, b1_ctx, bn), strict=True)]
        return {
            "output_tokens": k,
            "context_tokens": len(long),
            "short_batch_1_step_s": steps[0][0],
            "batch_1_step_s": steps[1][0],
            "batch_n": n,
            "batch_n_step_s": steps[2][0],
            "step_source": steps[2][1],
            "client_step_s": [compute_decode_step_s(c) for c in (b1, b1_ctx, bn)],
            "server_itl_s_short_batch_1": itl[0],
            "server_itl_s_batch_1": itl[1],
            "server_itl_s_batch_n": itl[2],
        }


def _p50(calls: Sequence[CallTiming]) -> float | None:
    values = [c.ttft_s for c in calls if c.ttft_s is not None]
    return statistics.median(values) if values else None


async def measure_testbed(
    openai_base_url: str,
    model: str,
    plan: CalibrationPlan,
    *,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """Measure the testbed's costs on a running server (see :mod:`agentkv.bench.testbed._costs`).

    Calibration prompts are salted under their own tenant and drawn from their own seed,
    so they never match a replayed prompt; the caller empties the cache afterwards. A
    failure is reported as ``{"error": ...}``, never raised.
    """
    from openai import AsyncOpenAI

    from agentkv.events._context import trajectory

    rng = random.Random(f"agentkv-testbed:{plan.seed}")

    def fresh(n: int) -> list[int]:
        return [rng.randrange(plan.vocab_low, plan.vocab_high) for _ in range(n)]

    raw = AsyncOpenAI(
        base_url=openai_base_url, api_key="agentkv-bench", max_retries=0, timeout=600.0
    )
    client, _ = wrap_client(raw)
    probe = _Probe(client, model, openai_base_url, ProcessSampler(server_pid), fresh)
    t_start = time.monotonic()
    load_before = load_average()
    out: dict[str, Any] = {}
    try:
        async with trajectory(tenant="agentkv-testbed", parent=None):
            short = fresh(plan.cached_tokens(8 * plan.block_size))
            long = fresh(plan.cached_tokens(plan.context_tokens))
            await probe.turn(short, 1)  # fill the cache
            await probe.turn(long, 1)
            out["fixed_turn"] = await probe.series(short, plan.fixed_turn_calls)
            out["cached_long_turn"] = await probe.series(long, plan.long_turn_calls)
            t_cached = out["cached_long_turn"]["client_ttft_s_p50"]
            out["prefill"] = await probe.prefill(plan, long, t_cached)
            out["decode"] = await probe.decode(plan, short, long)
    except Exception as exc:  # a failed calibration is reported, never fatal to the run
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        await raw.close()
    out["load_avg_1m"] = [load_before, load_average()]
    out["wall_s"] = time.monotonic() - t_start
    out["processes"] = probe.procs.pids or None
    return out


def measure_server(server: Any, plan: CalibrationPlan) -> dict[str, Any]:
    """:func:`measure_testbed` on a running :class:`~agentkv.vllm.Server` (its API, model
    and process), from synchronous code."""
    return asyncio.run(
        measure_testbed(server.openai_base_url, server.model, plan, server_pid=server.process.pid)
    )
