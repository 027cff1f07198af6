"""A LangGraph (LangChain v1 ``create_agent``) agent instrumented with one middleware.

How the tool calls are decided: **by a scripted plan in the harness**. The small model
(SmolLM2-135M) rarely emits well-formed tool calls, so ``ScriptedToolPlan`` (a middleware
placed after agentkv's) sends every model request to the real server, then replaces the
answer's tool calls with the next planned step. Requests, hints, tool runs and events
are all real; only the choice of tools is scripted.

``AgentKVMiddleware`` maps the graph's ``thread_id`` to the trajectory id, each tool
call to a tool event with its class, and wraps ``ChatOpenAI``'s client so its requests
carry the hints (merged with the model's own ``extra_body``). Run::

    python examples/langgraph_agent.py
"""

from __future__ import annotations

import itertools
from typing import Any

from _server import control_stats, endpoint
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

import agentkv
from agentkv.integrations.langgraph import AgentKVMiddleware, end_thread
from agentkv.testing import capture_events

PLAN: list[list[tuple[str, dict[str, Any]]]] = [
    [("grep", {"pattern": "TODO"})],
    [("read_file", {"path": "src/app.py"}), ("grep", {"pattern": "FIXME"})],  # parallel
    [("read_file", {"path": "src/util.py"})],
]  # then a final answer


@tool
def grep(pattern: str) -> str:
    """Search the repository for a pattern."""
    return f"src/app.py:12: {pattern}: handle the empty list"


@tool
def read_file(path: str) -> str:
    """Read one file of the repository."""
    return f"# {path}\ndef total(xs):\n    return sum(xs) / len(xs)\n"


class ScriptedToolPlan(AgentMiddleware):  # type: ignore[type-arg]
    """Send the real request, then take the tool calls from the plan (see the docstring)."""

    def __init__(self, plan: list[list[tuple[str, dict[str, Any]]]]) -> None:
        super().__init__()
        self.plan = list(plan)
        self.ids = itertools.count()

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        # The tools stay in the prompt; "none" because the server runs without a tool parser.
        response = handler(request.override(tool_choice="none"))
        real = response.result[0]
        step = self.plan.pop(0) if self.plan else []
        calls = [{"name": n, "args": a, "id": f"call-{next(self.ids)}"} for n, a in step]
        response.result[0] = AIMessage(
            content="" if calls else f"Done. (model said: {real.content!r})",
            tool_calls=calls,
            usage_metadata=real.usage_metadata,
        )
        return response


def main() -> None:
    with endpoint() as server:
        llm = ChatOpenAI(
            model=server.model,
            base_url=server.openai_base_url,
            api_key="-",
            max_tokens=8,
            temperature=0,
            extra_body={"top_k": 1},  # kept: agentkv merges its fields under yours
        )
        agent = create_agent(
            llm,
            tools=[grep, read_file],
            system_prompt="You are a careful coding agent. " * 10,
            middleware=[
                AgentKVMiddleware(tool_classes={"grep": "search", "read_file": "file_read"}),
                ScriptedToolPlan(PLAN),
            ],
            checkpointer=InMemorySaver(),
        )
        config = {"configurable": {"thread_id": "langgraph-demo-1"}}
        with capture_events() as events:
            out = agent.invoke({"messages": [{"role": "user", "content": "Fix total()."}]}, config)
            # A thread is a conversation: its KV waits for the next invoke. This demo is
            # done with it, so it ends the thread (trajectory_finished: the KV is released).
            end_thread("langgraph-demo-1")
        print("answer:", out["messages"][-1].content)
        for e in events:
            print(f"  {e.trajectory_id}  turn {e.turn_id}  {e.event:<20} {e.tool_class or ''}")
        print("prefix_reuse_ratio:", agentkv.stats().prefix_reuse_ratio)
        stats = control_stats(server.base_url)
        print("server hints_received:", stats.get("hints_received"))


if __name__ == "__main__":
    main()
