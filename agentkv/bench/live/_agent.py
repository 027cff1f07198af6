"""The live agent: a plain tool-using loop on agentkv's public API.

Each task runs inside ``agentkv.trajectory(tenant=task.tenant)``; every step is one chat
completion through an ``openai`` client wrapped by ``agentkv.wrap_openai`` (hints,
lifecycle events and turn records are the product's own), with the tools of
``agentkv.stable_tools`` rendered into the prompt and the answer held by the server's
structured outputs to :func:`~agentkv.bench.live._tools.step_schema`; every tool is an
``@agentkv.tool`` that really runs (:class:`~agentkv.bench.live._tools.ToolBox`). The
model's answer decides the next call: a tool call appends the model's step and the
tool's result to the conversation; the answer step ends the task and the task's checker
judges it. Each tool runs at most once per task: the next step's schema offers only the
task's tools not yet called, and the answer (a small model otherwise repeats its last
call until the step limit).

Decoding is greedy (``temperature`` 0), so the same task on the same model gives the same
answers in every arm unless the server changes the numbers: the agreement figures of
the report rest on that. A step that fails is recorded, never hidden: a request error
ends the task (outcome ``failed``), a reply that is not one JSON step is recorded as
``invalid`` and the agent asks again, and a task that has not answered after its step
limit ends as ``step_limit``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentkv.bench.live._tasks import Task, check_answer
from agentkv.bench.live._tools import ANSWER, ToolBox, step_schema, tool_schemas
from agentkv.events._context import trajectory
from agentkv.prefix._stable import stable_tools

__all__ = [
    "SYSTEM_PROMPT",
    "AgentOptions",
    "LiveRun",
    "StepRecord",
    "TaskRun",
    "run_task",
    "run_tasks",
]

_log = logging.getLogger("agentkv")

SYSTEM_PROMPT = (
    "You solve a task with tools. Each reply is one JSON step: a tool call, or "
    '{"tool": "answer", "text": ...} with the final answer once a tool result holds it.'
)
_NEXT = "If this result answers the task, reply with the answer step."
_RETRY = "That reply was not one JSON step. Reply with one JSON step."


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """How the agent runs: its step limit, each step's output cap, the tasks in flight."""

    max_steps: int = 4
    max_tokens: int = 48
    concurrency: int = 4
    max_answer_chars: int = 80


@dataclass(slots=True)
class StepRecord:
    """One model call of a task, and what came of it.

    ``kind``: ``tool`` (a tool ran), ``answer`` (the final answer), ``invalid`` (the reply
    was not one JSON step) or ``error`` (the request failed: ``error`` says how).
    """

    index: int
    kind: str
    output: str
    token_ids: list[int] | None
    latency_s: float
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    tool: str | None = None
    error: str | None = None


@dataclass(slots=True)
class TaskRun:
    """One task, start to end: ``outcome`` is ``accepted``, ``rejected`` (answered, the
    checker said no), ``step_limit`` (no answer within the limit) or ``failed`` (a step's
    request failed; ``failure`` names the step and the error)."""

    task_id: str
    tenant: str
    started_s: float
    jct_s: float = 0.0
    steps: list[StepRecord] = field(default_factory=list)
    answer: str | None = None
    outcome: str = "failed"
    failure: str | None = None
    trajectory_id: str | None = None

    @property
    def accepted(self) -> bool:
        """The checker accepted the answer."""
        return self.outcome == "accepted"

    def transcript(self) -> list[str]:
        """The model's replies, in order (what the agreement figures compare)."""
        return [s.output for s in self.steps]


@dataclass(slots=True)
class LiveRun:
    """Every task of one arm-repetition."""

    tasks: list[TaskRun]
    wall_s: float
    order: list[str]
    client_wrapped: bool = True


def _usage(response: Any) -> tuple[int | None, int | None, int | None]:
    usage = getattr(response, "usage", None)
    if usage is None:
        return None, None, None
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return usage.prompt_tokens, cached, usage.completion_tokens


def _token_ids(choice: Any) -> list[int] | None:
    ids = getattr(choice, "token_ids", None)
    if ids is None and getattr(choice, "model_extra", None):
        ids = choice.model_extra.get("token_ids")
    return [int(i) for i in ids] if ids is not None else None


def _parse_step(text: str) -> dict[str, Any] | None:
    try:
        step = json.loads(text)
    except ValueError:
        return None
    if not isinstance(step, dict) or not isinstance(step.get("tool"), str):
        return None
    return step


async def run_task(
    client: Any,
    model: str,
    task: Task,
    box: ToolBox,
    options: AgentOptions,
    *,
    t_origin: float | None = None,
    gap_key: str = "",
) -> TaskRun:
    """Run ``task`` against ``client`` (an ``openai.AsyncOpenAI`` wrapped by
    ``agentkv.wrap_openai``) until it answers, fails or reaches its step limit."""
    started = time.monotonic()
    run = TaskRun(task.task_id, task.tenant, started - (t_origin or started))
    tools = stable_tools(tool_schemas())
    unused = list(task.tools)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": task.prompt},
    ]
    box.gap_key = gap_key
    outcome = "step_limit"
    async with trajectory(tenant=task.tenant) as traj:
        run.trajectory_id = traj.trajectory_id
        for index in range(task.max_steps or options.max_steps):
            schema = step_schema(unused, box, options.max_answer_chars)
            response_format = {
                "type": "json_schema",
                "json_schema": {"name": "step", "schema": schema},
            }
            t0 = time.monotonic()
            try:
                response = await client.chat.completions.create(
                    model=model,
                    messages=messages,
                    tools=tools,
                    tool_choice="none",
                    response_format=response_format,
                    max_tokens=options.max_tokens,
                    temperature=0.0,
                    extra_body={"return_token_ids": True},
                )
            except Exception as exc:  # recorded: the task ends as failed
                error = f"{type(exc).__name__}: {exc}"
                run.steps.append(
                    StepRecord(index, "error", "", None, time.monotonic() - t0, error=error[:300])
                )
                run.failure = f"step {index}: {error[:300]}"
                outcome = "failed"
                _log.warning("live task %s step %d failed: %s", task.task_id, index, error)
                break
            choice = response.choices[0]
            text = choice.message.content or ""
            prompt, cached, completion = _usage(response)
            record = StepRecord(
                index,
                "invalid",
                text,
                _token_ids(choice),
                time.monotonic() - t0,
                prompt,
                cached,
                completion,
            )
            run.steps.append(record)
            messages.append({"role": "assistant", "content": text})
            step = _parse_step(text)
            if step is None:
                messages.append({"role": "user", "content": _RETRY})
                continue
            name = step.pop("tool")
            record.tool = name
            if name == ANSWER:
                record.kind = "answer"
                run.answer = str(step.get("text", ""))
                outcome = "accepted" if check_answer(task.check, run.answer) else "rejected"
                break
            record.kind = "tool"
            if name in unused:
                unused.remove(name)
            result = await box.call(name, step)
            messages.append({"role": "user", "content": f"Result of {name}:\n{result}\n{_NEXT}"})
    run.outcome = outcome
    run.jct_s = time.monotonic() - started
    return run


async def run_tasks(
    base_url: str,
    model: str,
    tasks: Sequence[Task],
    make_box: Callable[[], ToolBox],
    options: AgentOptions,
    *,
    seed: int = 0,
    rep: int = 0,
    on_task: Callable[[TaskRun], None] = lambda run: None,
    api_key: str = "agentkv-bench",
) -> LiveRun:
    """Run ``tasks`` against the server at ``base_url``, ``options.concurrency`` in flight,
    in an order shuffled by ``(seed, rep)`` (the same in every arm of a repetition)."""
    from openai import AsyncOpenAI

    from agentkv.client._wrap import wrap_openai

    raw = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600.0)
    client = wrap_openai(raw)
    order = list(tasks)
    random.Random(f"live-{seed}-{rep}").shuffle(order)
    queue = list(reversed(order))
    runs: list[TaskRun] = []
    t_origin = time.monotonic()

    async def worker() -> None:
        box = make_box()
        while queue:
            task = queue.pop()
            run = await run_task(
                client,
                model,
                task,
                box,
                options,
                t_origin=t_origin,
                gap_key=f"{seed}-{rep}-{task.task_id}",
            )
            runs.append(run)
            on_task(run)

    try:
        await asyncio.gather(*(worker() for _ in range(max(1, options.concurrency))))
    finally:
        await raw.close()
    by_id = {t.task_id: i for i, t in enumerate(tasks)}
    runs.sort(key=lambda r: by_id[r.task_id])
    return LiveRun(runs, time.monotonic() - t_origin, [t.task_id for t in order])
