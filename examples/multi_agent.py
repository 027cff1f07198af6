"""A planner with subagents and a join: parent/child trajectories, critical path, prefetch.

How the tool calls are decided: **by a scripted plan in the harness**: the planner
always fans out to three researcher subagents, waits for all of them (the join), then
writes the answer. Every model call is a real request to ``agentkv serve``.

What it shows:

- a trajectory opened inside another is a *child*: its events and hints carry the
  parent's id (``parentTrajectoryId`` / ``agentkv_parentTrajectoryId``);
- ``critical_path=True`` marks the subagent the join waits on longest, so a scheduler
  can favour it; the others are off the critical path;
- while the planner waits at the join (about a minute, learned from earlier joins) its
  next step is known: it resumes with the subagents' results. The advisor weighs a
  *prefetch* (on this CPU server: re-warm the prefix by recomputation just before the
  planner returns) against its cost: with a half-full KV pool it advises ``prefetch``,
  with a nearly full one the re-warm would crowd out live work and it advises
  ``release``. Run::

    python examples/multi_agent.py
"""

from __future__ import annotations

import asyncio

from _server import endpoint
from openai import AsyncOpenAI

import agentkv
from agentkv.testing import capture_events

SYSTEM = "You coordinate researchers that read a large repository. " * 8
RESEARCH_S = {"api": 0.2, "storage": 0.6, "auth": 0.3}  # storage is the slowest branch


@agentkv.tool(tool_class="web_fetch")
async def fetch(topic: str) -> str:
    """Pretend to fetch documents about a topic (the I/O wait)."""
    await asyncio.sleep(RESEARCH_S[topic])
    return f"notes on {topic}"


async def ask(client: AsyncOpenAI, model: str, messages: list[dict[str, str]]) -> str:
    reply = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=4, temperature=0
    )
    return reply.choices[0].message.content or ""


async def researcher(client: AsyncOpenAI, model: str, topic: str, critical: bool) -> str:
    """A subagent: its own trajectory, a child of the planner's."""
    async with agentkv.trajectory(f"research-{topic}", critical_path=critical) as traj:
        msgs = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"research {topic}"},
        ]
        await ask(client, model, msgs)
        notes = await fetch(topic)
        msgs.append({"role": "user", "content": notes})
        await ask(client, model, msgs)
        return f"{topic} (parent={traj.parent_id})"


def join_advice(
    planner_id: str, turn_id: int, prefix_tokens: int, kv_usage: float
) -> agentkv.CacheAdvice:
    """What the advisor says for the planner while it waits at the join."""
    gaps = agentkv.GapModel(min_samples=3)
    for wait_s in (40.0, 55.0, 70.0, 65.0):  # joins like this one took about a minute
        gaps.observe("join", wait_s)
    advisor = agentkv.Advisor(gaps, agentkv.CostModel(platform="cpu"))
    state = agentkv.TrajectoryState(
        trajectory_id=planner_id,
        turn_id=turn_id,
        tool_class="join",
        prefix_tokens=prefix_tokens,
        next_step_known=True,  # the planner resumes with the subagents' results
        p_next=0.95,
    )
    return advisor.advise(state, load=agentkv.LoadSnapshot(kv_usage=kv_usage, num_waiting=4))


async def amain() -> None:
    with endpoint() as server:
        client = agentkv.wrap_openai(AsyncOpenAI(base_url=server.openai_base_url, api_key="-"))
        slowest = max(RESEARCH_S, key=RESEARCH_S.__getitem__)
        with capture_events() as events:
            async with agentkv.trajectory("planner-1", tenant="acme") as planner:
                msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "plan"}]
                await ask(client, server.model, msgs)
                with agentkv.tool_call("join", name="wait_for_researchers"):
                    results = await asyncio.gather(
                        *(researcher(client, server.model, t, t == slowest) for t in RESEARCH_S)
                    )
                msgs.append({"role": "user", "content": "; ".join(results)})
                await ask(client, server.model, msgs)
        print("subagents:", results)
        for e in events:
            flags = f"parent={e.parent_trajectory_id}" if e.parent_trajectory_id else ""
            if e.critical_path:
                flags += " critical_path"
            print(
                f"  {e.trajectory_id:<18} turn {e.turn_id} {e.event:<20} {e.tool_class or '':<10} {flags}"
            )
        for kv_usage in (0.5, 0.9):  # a half-full pool, then a nearly full one
            advice = join_advice(planner.trajectory_id, 1, prefix_tokens=1500, kv_usage=kv_usage)
            print(
                f"advice at the join (KV pool {kv_usage:.0%} used): {advice.action} "
                f"({advice.reason}), ttl_ms={advice.ttl_ms}"
            )
        await client.close()


if __name__ == "__main__":
    asyncio.run(amain())
