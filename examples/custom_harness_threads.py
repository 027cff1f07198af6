"""Several agents at once on a thread pool, each with parallel tool calls on threads.

How the tool calls are decided: **by a scripted plan in the harness** (each step runs
two tools in parallel). The model calls are real requests to ``agentkv serve``.

Threads do not inherit ``contextvars``, so the trajectory does not follow a callable
into a pool by itself: ``agentkv.bind_context(fn)`` carries the current context (and so
the trajectory) into the worker thread. Run::

    python examples/custom_harness_threads.py
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from _server import endpoint
from openai import OpenAI

import agentkv
from agentkv.testing import capture_events

SYSTEM = "You are one of several agents working on a repository. " * 8


@agentkv.tool(tool_class="search")
def search(query: str) -> str:
    """Pretend to search (a short I/O wait)."""
    time.sleep(0.05)
    return f"3 hits for {query}"


@agentkv.tool(tool_class="test_run")
def run_tests(target: str) -> str:
    """Pretend to run tests (a longer I/O wait)."""
    time.sleep(0.2)
    return f"{target}: 12 passed"


def agent(client: OpenAI, model: str, name: str, tools: ThreadPoolExecutor) -> int:
    """One agent: three model turns, each followed by two parallel tool calls."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": name}]
    with agentkv.trajectory(name):
        for step in range(3):
            reply = client.chat.completions.create(
                model=model, messages=messages, max_tokens=4, temperature=0
            )
            messages.append(
                {"role": "assistant", "content": reply.choices[0].message.content or ""}
            )
            # Parallel tools on threads: bind_context carries the trajectory along.
            a = tools.submit(agentkv.bind_context(search), f"{name}-{step}")
            b = tools.submit(agentkv.bind_context(run_tests), f"tests/{name}")
            messages.append({"role": "user", "content": f"{a.result()}\n{b.result()}"})
    return step + 1


def main() -> None:
    with endpoint() as server:
        client = agentkv.wrap_openai(OpenAI(base_url=server.openai_base_url, api_key="-"))
        with (
            capture_events() as events,
            ThreadPoolExecutor(4) as tools,
            ThreadPoolExecutor(3) as agents,
        ):
            futures = [
                agents.submit(agent, client, server.model, f"thread-agent-{i}", tools)
                for i in range(3)
            ]
            steps = [f.result() for f in futures]
        by_traj: dict[str, list[str]] = {}
        for e in events:
            by_traj.setdefault(e.trajectory_id, []).append(e.event)
        for tid, kinds in sorted(by_traj.items()):
            print(
                f"{tid}: {kinds.count('model_started')} turns, {kinds.count('tool_started')} tool calls, last={kinds[-1]}"
            )
        print("steps per agent:", steps)
        print("prefix_reuse_ratio:", agentkv.stats().prefix_reuse_ratio)
        client.close()


if __name__ == "__main__":
    main()
