"""Client-side prefix accounting equals what a real vLLM server reports.

Two turns of a coding-agent conversation are rendered through the served model's own
tokenizer and chat template; the shared prefix in whole blocks
(:func:`agentkv.matched_prefix_tokens`) must equal the server's
``usage.prompt_tokens_details.cached_tokens`` for the second turn, and the rendered
token ids must equal the server's own ``/tokenize`` of the same request.
"""

from __future__ import annotations

import copy
from typing import Any

import httpx
import pytest

import agentkv
from agentkv import CacheNamespace, compute_block_hashes, matched_prefix_tokens, stable_tools
from agentkv.prefix._render import load_tokenizer, render_prompt

pytestmark = pytest.mark.server

BLOCK_SIZE_TOKENS = 32

SYSTEM = (
    "You are a software engineering agent working inside a checked-out Python repository. "
    "Investigate the issue, make the smallest change that fixes it, and run the tests. "
    "Use the tools; one tool call per turn. When the work is done, call finish."
)
TOOLS = stable_tools(
    [
        {
            "type": "function",
            "function": {
                "name": "execute_bash",
                "description": "Run a bash command in the repository and return its output.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "command": {"type": "string", "description": "The command to run."},
                        "timeout_s": {"type": "number", "description": "Seconds to wait."},
                    },
                    "required": ["command"],
                },
            },
        },
        {
            "name": "str_replace_editor",
            "description": "View a file, or replace an exact string in it.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "enum": ["view", "str_replace"]},
                    "path": {"type": "string"},
                    "old_str": {"type": "string"},
                    "new_str": {"type": "string"},
                },
                "required": ["command", "path"],
            },
        },
        {
            "name": "finish",
            "description": "Stop: the task is complete.",
            "parameters": {"type": "object", "properties": {}},
        },
    ]
)
TURN_1 = [
    {"role": "system", "content": SYSTEM},
    {
        "role": "user",
        "content": (
            "The function parse_duration('1h30m') returns 5400.0 but the docs say it returns "
            "an int. Fix it so it returns an int and add a test."
        ),
    },
]
TURN_2 = [
    *TURN_1,
    {
        "role": "assistant",
        "content": "Let me look for parse_duration first.",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {
                    "name": "execute_bash",
                    "arguments": '{"command": "grep -rn \\"def parse_duration\\" src"}',
                },
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_0",
        "content": "src/timeutil.py:12:def parse_duration(text: str) -> float:",
    },
]


@pytest.fixture()
def server(stock_server: Any) -> Any:
    """The shared stock-vLLM test server (tiny model, block size 32, prefix caching on)."""
    assert stock_server.profile.block_size == BLOCK_SIZE_TOKENS
    return stock_server


@pytest.fixture()
def tokenizer(server: Any) -> Any:
    """The served model's own tokenizer and chat template, loaded with transformers."""
    return load_tokenizer(server.profile.model)


def _chat(server: Any, messages: list[Any], tools: list[Any], **extra: Any) -> dict[str, Any]:
    body = {
        "model": server.model,
        "messages": messages,
        "tools": tools,
        "max_tokens": 1,
        "temperature": 0,
        # "auto" needs a tool-call parser on the server; "none" still renders the tools
        "tool_choice": "none",
        **extra,
    }
    response = httpx.post(f"{server.openai_base_url}/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def _cached_tokens(result: dict[str, Any]) -> int:
    details = result["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def test_rendered_tokens_equal_the_servers_tokenize(server: Any, tokenizer: Any) -> None:
    for messages in (TURN_1, TURN_2):
        body = {"model": server.model, "messages": messages, "tools": TOOLS}
        response = httpx.post(f"{server.base_url}/tokenize", json=body, timeout=120)
        response.raise_for_status()
        assert render_prompt(tokenizer, messages, TOOLS).token_ids == response.json()["tokens"]


def test_shared_prefix_in_blocks_equals_cached_tokens(server: Any, tokenizer: Any) -> None:
    salt = "test-shared-prefix"  # a fresh partition: nothing cached from other tests
    one = render_prompt(tokenizer, TURN_1, TOOLS).token_ids
    two = render_prompt(tokenizer, TURN_2, TOOLS).token_ids
    first = _chat(server, TURN_1, TOOLS, cache_salt=salt)
    assert first["usage"]["prompt_tokens"] == len(one)
    assert _cached_tokens(first) == 0
    second = _chat(server, TURN_2, TOOLS, cache_salt=salt)
    assert second["usage"]["prompt_tokens"] == len(two)
    expected = matched_prefix_tokens(one, two, BLOCK_SIZE_TOKENS)
    assert expected > 0 and expected % BLOCK_SIZE_TOKENS == 0
    assert _cached_tokens(second) == expected
    # the same answer from the block-hash chains, salted as the server salts them
    h1 = compute_block_hashes(one, BLOCK_SIZE_TOKENS, cache_salt=salt)
    h2 = compute_block_hashes(two, BLOCK_SIZE_TOKENS, cache_salt=salt)
    shared_blocks = next(
        (i for i, (a, b) in enumerate(zip(h1, h2, strict=False)) if a != b), len(h1)
    )
    assert shared_blocks * BLOCK_SIZE_TOKENS == expected


def test_unstable_tool_key_order_costs_the_prefix_and_lint_sees_it(
    server: Any, tokenizer: Any
) -> None:
    salt = "test-unstable-tools"
    _chat(server, TURN_1, TOOLS, cache_salt=salt)
    shuffled = copy.deepcopy(TOOLS)
    for tool in shuffled:  # same tools, parameters dict built in reverse key order
        params = tool["function"]["parameters"]
        tool["function"]["parameters"] = dict(reversed(list(params.items())))
    two = render_prompt(tokenizer, TURN_2, shuffled).token_ids
    one = render_prompt(tokenizer, TURN_1, TOOLS).token_ids
    result = _chat(server, TURN_2, shuffled, cache_salt=salt)
    assert _cached_tokens(result) == matched_prefix_tokens(one, two, BLOCK_SIZE_TOKENS)
    assert _cached_tokens(result) < matched_prefix_tokens(
        one, render_prompt(tokenizer, TURN_2, TOOLS).token_ids, BLOCK_SIZE_TOKENS
    )
    findings = agentkv.lint_prompt(
        {"messages": TURN_2, "tools": shuffled},
        previous={"messages": TURN_1, "tools": TOOLS},
        tokenizer=tokenizer,
    )
    assert "tools_changed" in {f.kind for f in findings}
    divergence = next(f for f in findings if f.kind == "prefix_divergence")
    assert divergence.token_offset is not None
    assert divergence.token_offset // BLOCK_SIZE_TOKENS * BLOCK_SIZE_TOKENS == _cached_tokens(
        result
    )


def test_tenant_salts_isolate_tenants(server: Any, tokenizer: Any) -> None:
    namespace = CacheNamespace.from_tokenizer(tokenizer, model=server.model, revision="tiny")
    acme, globex = namespace.cache_salt("acme"), namespace.cache_salt("globex")
    _chat(server, TURN_1, TOOLS, cache_salt=acme)
    assert _cached_tokens(_chat(server, TURN_2, TOOLS, cache_salt=globex)) == 0
    assert _cached_tokens(_chat(server, TURN_2, TOOLS, cache_salt=acme)) > 0
