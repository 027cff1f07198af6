"""A plain agent loop instrumented with agentkv, against ``agentkv serve`` on SmolLM2.

How the tool calls are decided: **by the model, as a structured decision**. Each turn
asks the server to answer with exactly one of the allowed names (vLLM's per-request
``structured_outputs={"choice": [...]}``), so the small model always returns a valid
choice. The harness allows ``finish`` only from the third turn on (so the demo
always runs some tools) and stops after ``max_steps`` turns.

What agentkv does here: ``trajectory()`` scopes the run, ``@agentkv.tool`` turns each
tool call into ``tool_started`` / ``tool_finished`` with its class, ``wrap_openai``
attaches the hints to every request, and ``stable_tools`` keeps the tool schema
byte-identical across turns. Run::

    python examples/custom_harness.py
"""

from __future__ import annotations

import json

from _server import control_stats, endpoint
from openai import OpenAI

import agentkv
from agentkv.testing import capture_events

SYSTEM = "You are a careful coding agent. Pick the next tool: grep, read_file or finish. " * 6
TOOLS = agentkv.stable_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "grep",
                "description": "Search the repository.",
                "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}},
            },
        },
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read one file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        },
    ]
)
CHOICES = ["grep", "read_file", "finish"]


@agentkv.tool(tool_class="search")
def grep(pattern: str) -> str:
    """Pretend to search the repository."""
    return f"src/app.py:12: {pattern}: handle the empty list"


@agentkv.tool(tool_class="file_read")
def read_file(path: str) -> str:
    """Pretend to read a file."""
    return f"# {path}\ndef total(xs):\n    return sum(xs) / len(xs)\n"


def run_agent(client: OpenAI, model: str, task: str, *, max_steps: int = 4) -> list[str]:
    """One trajectory: ask for a decision, run the chosen tool, repeat."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    chosen: list[str] = []
    for step in range(max_steps):
        allowed = CHOICES if step >= 2 else CHOICES[:-1]
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,
            tool_choice="none",  # the tools shape the prompt; the decision comes as text
            max_tokens=8,
            temperature=0,
            extra_body={"structured_outputs": {"choice": allowed}},
        )
        decision = reply.choices[0].message.content or "finish"
        chosen.append(decision)
        if decision == "finish":
            break
        result = grep("TODO") if decision == "grep" else read_file("src/app.py")
        messages.append({"role": "assistant", "content": decision})
        messages.append({"role": "user", "content": f"[{decision} step {step}] {result}"})
    return chosen


def main() -> None:
    with endpoint() as server:
        client = agentkv.wrap_openai(OpenAI(base_url=server.openai_base_url, api_key="-"))
        with capture_events() as events, agentkv.trajectory("harness-1", tenant="acme"):
            chosen = run_agent(client, server.model, "Find why total() crashes.")
        print("model decisions:", chosen)
        for e in events:
            print(f"  turn {e.turn_id}  {e.event:<20} {e.tool_class or ''}")
        stats = agentkv.stats()
        print("prefix_reuse_ratio:", stats.prefix_reuse_ratio)
        server_stats = control_stats(server.base_url)
        print(
            "server:",
            json.dumps({k: server_stats.get(k) for k in ("hints_received", "events_received")}),
        )
        client.close()


if __name__ == "__main__":
    main()
