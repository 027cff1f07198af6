"""Three consecutive turns of one coding agent whose prompt prefix stays intact.

Shared by the prompt-lint tests (the function and the ``agentkv lint`` command): each turn
extends the one before it, with the same system prompt and the same stable tool list.
"""

from __future__ import annotations

from agentkv import stable_tools

SYSTEM = "You are a coding agent working in the repository. Follow the instructions."
TOOLS = stable_tools(
    [
        {
            "name": "run",
            "description": "Run a shell command.",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
        },
        {"name": "edit", "description": "Edit a file.", "parameters": {"type": "object"}},
    ]
)
CALL = {
    "id": "call_abc",
    "type": "function",
    "function": {"name": "run", "arguments": '{"cmd": "ls", "cwd": "."}'},
}
TURN_1 = {
    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "List files."}],
    "tools": TOOLS,
}
TURN_2 = {
    "messages": [
        *TURN_1["messages"],
        {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "ls"},
        {"role": "tool", "tool_call_id": "call_abc", "content": "a.py\nb.py"},
    ],
    "tools": TOOLS,
}
TURN_3 = {
    "messages": [
        *TURN_2["messages"],
        {"role": "assistant", "content": "Two files."},
        {"role": "user", "content": "Thanks"},
    ],
    "tools": TOOLS,
}
