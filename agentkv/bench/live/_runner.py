"""The live-agent protocol: the bench's arms and servers, a real agent on each.

The servers are the replay bench's own: one :class:`~agentkv.bench.run._servers.ArmServers`
set (one server per arm, each repetition visiting the arms in a freshly shuffled order),
driven by :func:`~agentkv.bench.run._runner.run_pool`, every arm's profile from
:func:`~agentkv.bench.run._arms.arm_options`, every replay on an emptied cache. What runs
on them is :func:`~agentkv.bench.live._agent.run_tasks` instead of a trace replay, with
the server's structured outputs on (xgrammar, no free whitespace: what makes a small
model's JSON steps reliable on the CPU build).

Memory pressure is the replay demo's: the pool holds ``pool_fraction`` (0.3) of the
working set, estimated before the run as one typical context per task in flight (the
longest first prompt, measured with the model's tokenizer, and one step at its caps); ``max_model_len`` holds the longest context at the step limit;
arm L holds every task's context of a repetition plus one per task in flight. The report
also gives the pool as a share of the working set measured in arm B.

After a repetition's tasks, the first repetition of each arm also sends the
:func:`agreement_prompts` one at a time (greedy, batch of one): the token ids of each
answer are what "hints change nothing but speed" compares across arms.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentkv._errors import ConfigError, ServeError
from agentkv.bench.live._agent import SYSTEM_PROMPT, AgentOptions, LiveRun, run_tasks
from agentkv.bench.live._tasks import TaskSet, load_tasks
from agentkv.bench.live._tools import MAX_RESULT_CHARS, GapSampler, ToolBox, tool_schemas
from agentkv.bench.run._arms import arm_description, arm_unavailable, uses_fp8
from agentkv.bench.run._runner import run_pool, serve_options
from agentkv.bench.run._servers import ArmServers, ServerSet
from agentkv.bench.testbed._cpulayout import CPU_LAYOUTS, pinned
from agentkv.bench.testbed._scrape import counters_delta, read_counters
from agentkv.vllm._platform import PlatformInfo
from agentkv.workload._pool import ArmPlan, plan_pool

__all__ = [
    "FACT_PROMPTS",
    "STRUCTURED_OUTPUTS",
    "LiveConfig",
    "LiveRep",
    "agreement_prompts",
    "run_live",
]

#: The server's structured-outputs setting in every live arm.
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}

#: Plain questions added to the agreement prompts (answers a person can check).
FACT_PROMPTS = (
    "What is the capital of France?",
    "How many days are in a week?",
    "Name a primary colour.",
    "What is 2 + 2?",
)

Progress = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class LiveConfig:
    """Everything one ``agentkv bench --live`` run needs (recorded in ``results.json``)."""

    tasks_path: str | None = None  # None: the bundled tasks
    arms: tuple[str, ...] = ("B", "E", "G", "L")
    reps: int = 3
    seed: int = 0
    pool_fraction: float = 0.3
    block_size: int = 32
    model: str | None = "smollm2"
    agent: AgentOptions = field(default_factory=AgentOptions)
    max_gap_s: float = 3.0
    out_dir: str = "agentkv-bench-live"
    cpu_layout: str = "split"
    cpu_memory_fraction: float = 0.2
    startup_timeout_s: float = 900.0
    max_parallel_starts: int = 3
    agreement_probe: bool = True
    extra_serve_options: dict[str, Any] = field(default_factory=dict)
    measure_testbed: bool = False  # the replay's calibration probe does not apply here

    def __post_init__(self) -> None:
        if self.reps < 1:
            raise ConfigError("reps must be at least 1")
        if not self.pool_fraction > 0:
            raise ConfigError(f"pool fraction must be positive, got {self.pool_fraction}")
        if self.cpu_layout not in CPU_LAYOUTS:
            raise ConfigError(f"cpu_layout must be one of {', '.join(CPU_LAYOUTS)}")
        if self.agent.max_steps < 1 or self.agent.max_tokens < 8 or self.agent.concurrency < 1:
            raise ConfigError("max_steps and concurrency must be positive, max_tokens >= 8")


@dataclass
class LiveRep:
    """One arm-repetition of the live bench."""

    arm: str
    rep: int
    order: int
    live: LiveRun
    vllm: dict[str, float]
    agentkv: dict[str, float]
    client_stats: dict[str, Any]
    cache_reset: str
    probe: list[list[int] | None] | None = None  # agreement prompts' answer token ids


def agreement_prompts(tasks: TaskSet) -> list[list[dict[str, str]]]:
    """The prompts sent one at a time to every arm: each task's first step, then
    :data:`FACT_PROMPTS`; the index of a prompt is its place in this list."""
    out = [
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": t.prompt}]
        for t in tasks.tasks
    ]
    return out + [[{"role": "user", "content": q}] for q in FACT_PROMPTS]


def _context_tokens(model_dir: str | None, tasks: TaskSet, agent: AgentOptions) -> tuple[int, int]:
    """The longest task's context (tokens, estimated): at the step limit (an upper bound,
    what ``max_model_len`` must hold) and at its typical length (its first prompt and
    one step: what the working set is sized by)."""
    longest = max(len(SYSTEM_PROMPT) + len(t.prompt) for t in tasks.tasks)
    tools_chars = len(json.dumps(tool_schemas()))
    chars_per_token = 3.0  # fallback when the tokenizer cannot be read
    if model_dir is not None and (Path(model_dir) / "tokenizer.json").is_file():
        try:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
            sample = SYSTEM_PROMPT + json.dumps(tool_schemas()) + tasks.tasks[0].prompt
            chars_per_token = len(sample) / max(1, len(tok.encode(sample).ids))
        except Exception:  # the estimate falls back to a fixed ratio
            pass
    first = math.ceil((longest + tools_chars + 400) / chars_per_token)  # + template text
    steps = max(t.max_steps or agent.max_steps for t in tasks.tasks)
    per_step = agent.max_tokens + math.ceil((MAX_RESULT_CHARS + 80) / chars_per_token)
    return first + steps * per_step, first + per_step


@dataclass
class _LiveSetup:
    cfg: LiveConfig
    tasks: TaskSet
    platform: PlatformInfo
    model_dir: str | None
    emit: Progress
    sampler: GapSampler


def _plans(run: _LiveSetup) -> tuple[ArmPlan, ArmPlan, dict[str, Any]]:
    cfg = run.cfg
    context, typical = _context_tokens(run.model_dir, run.tasks, cfg.agent)
    in_flight = min(cfg.agent.concurrency, len(run.tasks.tasks))
    working_set = in_flight * typical
    plan, clamped = plan_pool(working_set, cfg.pool_fraction, context, cfg.block_size)
    per_task = -(-context // cfg.block_size)
    limit = ArmPlan(
        cfg.block_size,
        max(plan.pool_blocks, (len(run.tasks.tasks) + in_flight) * per_task),
        plan.max_model_len,
    )
    record = {
        "pool_fraction": cfg.pool_fraction,
        "pool_blocks": plan.pool_blocks,
        "pool_tokens": plan.pool_tokens(),
        "limit_pool_blocks": limit.pool_blocks,
        "block_size": cfg.block_size,
        "max_model_len": plan.max_model_len,
        "context_tokens_estimate": context,
        "typical_context_tokens_estimate": typical,
        "tasks_in_flight": in_flight,
        "working_set_tokens_estimate": working_set,
        "raised_to_fit_longest_context": clamped,
    }
    return plan, limit, record


async def _probe(
    base_url: str, model: str, prompts: Sequence[list[dict[str, str]]], max_tokens: int
) -> list[list[int] | None]:
    """Each prompt alone, greedy; its answer's token ids (None: the request failed)."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="agentkv-bench", max_retries=0, timeout=300.0)
    out: list[list[int] | None] = []
    try:
        for messages in prompts:
            try:
                r = await client.chat.completions.create(
                    model=model,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=max_tokens,
                    temperature=0.0,
                    extra_body={"return_token_ids": True},  # type: ignore[arg-type]
                )
                choice: Any = r.choices[0]
                ids = getattr(choice, "token_ids", None)
                if ids is None and choice.model_extra:
                    ids = choice.model_extra.get("token_ids")
                out.append([int(i) for i in ids] if ids is not None else None)
            except Exception:  # recorded as no answer: it disagrees with every answer
                out.append(None)
    finally:
        await client.close()
    return out


def _once(run: _LiveSetup) -> Callable[[ServerSet, str, int, int], LiveRep]:
    from agentkv.client import _accounting
    from agentkv.events._config import configure
    from agentkv.gaps._model import GapModel
    from agentkv.vllm._control import STATS_MAX_AGE_S

    def once(servers: ServerSet, arm: str, rep: int, position: int) -> LiveRep:
        how = servers.cold(arm)
        server = servers.server(arm)
        run.emit("replay_start", {"arm": arm, "rep": rep, "fraction": run.cfg.pool_fraction})
        before = read_counters(server)
        _accounting.reset()
        configure(gap_model=GapModel())  # every arm's agent starts from the shipped priors
        with pinned(servers.client_cpus(arm)):
            live = asyncio.run(
                run_tasks(
                    server.openai_base_url,
                    server.model,
                    run.tasks.tasks,
                    lambda: ToolBox(run.tasks.root, run.sampler),
                    run.cfg.agent,
                    seed=run.cfg.seed,
                    rep=rep,
                    on_task=lambda t: run.emit("turn", {}),
                )
            )
            stats = _accounting.stats().to_dict()
            probe = None
            if run.cfg.agreement_probe and rep == 0:
                probe = asyncio.run(
                    _probe(
                        server.openai_base_url,
                        server.model,
                        agreement_prompts(run.tasks),
                        run.cfg.agent.max_tokens,
                    )
                )
        time.sleep(STATS_MAX_AGE_S + 0.1)
        moved = counters_delta(before, read_counters(server))
        run.emit("replay_done", {"arm": arm, "rep": rep, "wall_s": live.wall_s})
        return LiveRep(arm, rep, position, live, moved["vllm"], moved["agentkv"], stats, how, probe)

    return once


def run_live(cfg: LiveConfig, notify: Progress | None = None) -> dict[str, Any]:
    """Run the live-agent protocol; return the raw results for
    :func:`agentkv.bench.report._live.build_live_results`."""
    from agentkv.models import embedded_model_name, ensure_embedded_model
    from agentkv.vllm._platform import detect_platform

    emit = notify or (lambda kind, data: None)
    tasks = load_tasks(cfg.tasks_path)
    platform = detect_platform()
    model_dir: str | None
    embedded = embedded_model_name(cfg.model)
    if embedded is not None:
        model_dir = str(ensure_embedded_model(embedded))
    else:
        model_dir = cfg.model if cfg.model and Path(cfg.model).is_dir() else None
    run = _LiveSetup(cfg, tasks, platform, model_dir, emit, GapSampler(max_gap_s=cfg.max_gap_s))
    runnable = [a for a in cfg.arms if arm_unavailable(a, platform) is None]
    not_run = {a: r for a in cfg.arms if (r := arm_unavailable(a, platform)) is not None}
    plan, limit, pool = _plans(run)
    emit(  # progress: one "replay" per arm-repetition, one "turn" per task
        "plan",
        {"total": len(runnable) * cfg.reps, "turns_per_replay": len(tasks.tasks), "arms": runnable},
    )

    def options(arm: str) -> dict[str, Any]:
        return serve_options(
            arm,
            limit if arm == "L" else plan,
            platform,
            cpu_memory_fraction=cfg.cpu_memory_fraction,
            extra=cfg.extra_serve_options,
            extra_args=["--structured-outputs-config", json.dumps(STRUCTURED_OUTPUTS)],
        )

    servers = ArmServers(cfg, plan, options, emit, platform)
    record: dict[str, dict[str, Any]] = {"cpu_layout": {}, "testbed": {}}
    reps, argv = run_pool(
        run, servers, cfg.pool_fraction, runnable, random.Random(cfg.seed), record, once=_once(run)
    )
    if not reps and runnable:
        raise ServeError("no live repetition completed")
    return {
        "config": cfg,
        "tasks": tasks,
        "platform": platform.name,
        "model_dir": model_dir,
        "pool": pool,
        "argv": argv,
        "cpu_layout": record["cpu_layout"],
        "reps": reps,
        "not_run": not_run,
        "descriptions": {a: arm_description(a, platform) for a in cfg.arms},
        "fp8_arms": [a for a in runnable if uses_fp8(a, platform)],
        "fp8_kv": {"supported": platform.fp8_kv_supported, "reason": platform.fp8_kv_reason},
        "agreement_prompts": len(agreement_prompts(tasks)),
    }
