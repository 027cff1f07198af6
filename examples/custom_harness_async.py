"""Several agents at once on asyncio, with parallel tool calls (``asyncio.gather``).

How the tool calls are decided: **by a scripted plan in the harness** (each step runs
two tools concurrently). The model calls are real requests to ``agentkv serve``.

asyncio tasks inherit ``contextvars``: a task created inside ``async with
agentkv.trajectory()`` (``gather``, ``create_task``) belongs to that trajectory with no
extra code. ``@agentkv.tool`` works on coroutine functions as on plain ones. Run::

    python examples/custom_harness_async.py
"""

from __future__ import annotations

import asyncio

from _server import endpoint
from openai import AsyncOpenAI

import agentkv
from agentkv.testing import capture_events

SYSTEM = "You are one of several agents working on a repository. " * 8


@agentkv.tool(tool_class="search")
async def search(query: str) -> str:
    """Pretend to search (a short I/O wait)."""
    await asyncio.sleep(0.05)
    return f"3 hits for {query}"


@agentkv.tool(tool_class="test_run")
async def run_tests(target: str) -> str:
    """Pretend to run tests (a longer I/O wait)."""
    await asyncio.sleep(0.2)
    return f"{target}: 12 passed"


async def agent(client: AsyncOpenAI, model: str, name: str) -> int:
    """One agent: three model turns, each followed by two concurrent tool calls."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": name}]
    async with agentkv.trajectory(name):
        for step in range(3):
            reply = await client.chat.completions.create(
                model=model, messages=messages, max_tokens=4, temperature=0
            )
            messages.append(
                {"role": "assistant", "content": reply.choices[0].message.content or ""}
            )
            found, tested = await asyncio.gather(
                search(f"{name}-{step}"), run_tests(f"tests/{name}")
            )
            messages.append({"role": "user", "content": f"{found}\n{tested}"})
    return step + 1


async def amain() -> None:
    with endpoint() as server:
        client = agentkv.wrap_openai(AsyncOpenAI(base_url=server.openai_base_url, api_key="-"))
        with capture_events() as events:
            steps = await asyncio.gather(
                *(agent(client, server.model, f"async-agent-{i}") for i in range(3))
            )
        by_traj: dict[str, list[str]] = {}
        for e in events:
            by_traj.setdefault(e.trajectory_id, []).append(e.event)
        for tid, kinds in sorted(by_traj.items()):
            print(
                f"{tid}: {kinds.count('model_started')} turns, {kinds.count('tool_started')} tool calls, last={kinds[-1]}"
            )
        print("steps per agent:", steps)
        print("prefix_reuse_ratio:", agentkv.stats().prefix_reuse_ratio)
        await client.close()


if __name__ == "__main__":
    asyncio.run(amain())
