"""lint_prompt: volatile content, unstable tools, rewritten history, divergence point."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentkv import LintFinding, lint_prompt, stable_tools
from tests.support.agent_turns import SYSTEM, TOOLS, TURN_1, TURN_2, TURN_3


def _kinds(findings: list[LintFinding]) -> list[str]:
    return [f.kind for f in findings]


def test_clean_conversation_has_no_findings() -> None:
    assert lint_prompt(TURN_1) == []
    assert lint_prompt(TURN_2, previous=TURN_1) == []
    assert lint_prompt(TURN_3, previous=TURN_2) == []
    # message list plus separate tools works the same
    assert lint_prompt(TURN_2["messages"], tools=TOOLS, previous=TURN_1["messages"]) == []


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("Current time: 2025-03-04T10:22:01Z.", "timestamp"),
        ("Today is 2025-03-04.", "date"),
        ("Today is March 4, 2025.", "date"),
        ("Today is 4 Mar 2025.", "date"),
        ("Date: 03/04/2025", "date"),
        ("Session 123e4567-e89b-12d3-a456-426614174000 started.", "UUID"),
        ("Tracking req_8f3k2j9d1x for this run.", "request id"),
        ("request-id: 77ab-12", "request id"),
        ("Agent pid=48213 is running.", "PID"),
        ("Scratch dir: /tmp/agent-3k2j/work", "temp path"),
        ("Scratch dir: /var/folders/xy/abc/T/tmpa1b2c3", "temp path"),
        ("Scratch file tmpk3j9x2q1 was made.", "temp path"),
        ("Started at 1741083721 seconds.", "epoch time"),
        ("Clock 10:22:01 now.", "time of day"),
        ("Nonce 9f86d081884c7d659a2feaa0c55ad015 here.", "random hex"),
    ],
)
def test_volatile_content_in_system_prompt(text: str, label: str) -> None:
    findings = lint_prompt([{"role": "system", "content": f"{SYSTEM} {text}"}])
    assert _kinds(findings) == ["volatile_content"]
    (finding,) = findings
    assert finding.message.startswith(label), finding.message
    assert finding.message_index == 0
    assert finding.location == "messages[0].content"
    start = len(SYSTEM) + 1
    assert start <= (finding.char_offset or 0) < start + len(text)
    assert finding.severity == "warning" and not finding.prefix_breaking
    assert "system prompt" in finding.fix


@pytest.mark.parametrize(
    "text",
    [
        "Use Python 3.11 and keep lines under 100 characters.",
        "Version 1.2.3 of the API; see RFC 8785 section 3.2.",
        "Return at most 50 results, sorted by score.",
        "Files live in /workspace/src and /home/user/project.",
        "Write scratch files to the tmp_directory setting.",
        "Use run_tests and req_handler for tracing.",
    ],
)
def test_ordinary_text_is_not_flagged(text: str) -> None:
    assert lint_prompt([{"role": "system", "content": text}]) == []


def test_volatile_content_in_user_messages_is_not_flagged() -> None:
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "It is 2025-03-04."},
    ]
    assert lint_prompt(messages) == []


def test_volatile_content_in_tool_descriptions_and_schema() -> None:
    tools = stable_tools(
        [
            {
                "name": "run",
                "description": "Run a command (generated 2025-03-04T10:00:00Z).",
                "parameters": {
                    "type": "object",
                    "properties": {"cwd": {"type": "string", "default": "/tmp/run-abc123"}},
                },
            }
        ]
    )
    findings = lint_prompt([{"role": "user", "content": "hi"}], tools=tools)
    locations = {f.location for f in findings}
    assert locations == {
        "tools[0] (run).function.description",
        "tools[0] (run).function.parameters",
    }
    assert all(f.message_index is None for f in findings)


def test_system_prompt_in_content_parts_is_scanned() -> None:
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Now: 2025-01-01T00:00:00Z"}]}
    ]
    assert _kinds(lint_prompt(messages)) == ["volatile_content"]


def test_non_canonical_tools_are_reported() -> None:
    raw = [TOOLS[1], TOOLS[0]]  # not sorted by name
    findings = lint_prompt(TURN_1["messages"], tools=raw)
    assert _kinds(findings) == ["tools_not_canonical"]
    assert "stable_tools" in findings[0].fix
    assert not findings[0].prefix_breaking


def test_invalid_tools_are_reported_not_raised() -> None:
    findings = lint_prompt(TURN_1["messages"], tools=[{"description": "no name"}])
    assert _kinds(findings) == ["tools_invalid"]


def test_tools_changed_between_turns() -> None:
    current = {**TURN_2, "tools": [TOOLS[1], TOOLS[0]]}
    findings = lint_prompt(current, previous=TURN_1)
    changed = next(f for f in findings if f.kind == "tools_changed")
    assert changed.prefix_breaking and changed.severity == "error"
    assert "different order or key order" in changed.message
    divergence = findings[-1]
    assert divergence.kind == "prefix_divergence" and divergence.location == "tools"

    schema_change = copy.deepcopy(TOOLS)
    schema_change[0]["function"]["description"] = "Edit one file."
    findings = lint_prompt({**TURN_2, "tools": schema_change}, previous=TURN_1)
    assert "description or schema changed" in findings[0].message

    fewer = lint_prompt({**TURN_2, "tools": TOOLS[:1]}, previous=TURN_1)
    assert "tool list changed (2 -> 1 tools" in fewer[0].message


def test_system_prompt_changed() -> None:
    current = copy.deepcopy(TURN_2)
    current["messages"][0]["content"] = SYSTEM.replace("Follow", "Obey")
    findings = lint_prompt(current, previous=TURN_1)
    assert _kinds(findings) == ["system_changed", "prefix_divergence"]
    assert findings[0].char_offset == SYSTEM.index("Follow")
    assert findings[1].char_offset == SYSTEM.index("Follow")
    assert findings[1].message_index == 0


def test_history_content_rewritten() -> None:
    current = copy.deepcopy(TURN_3)
    current["messages"][3]["content"] = "a.py\nb.py\n(truncated)"
    findings = lint_prompt(current, previous=TURN_2)
    assert _kinds(findings) == ["history_rewritten", "prefix_divergence"]
    assert findings[0].message_index == 3 and findings[0].char_offset == len("a.py\nb.py")
    assert all(f.prefix_breaking for f in findings)


def test_tool_arguments_reserialized_with_other_whitespace_or_key_order() -> None:
    compact = copy.deepcopy(TURN_3)
    compact["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"cmd":"ls","cwd":"."}'
    (finding, _) = lint_prompt(compact, previous=TURN_2)
    assert finding.kind == "tool_arguments_reserialized"
    assert finding.severity == "warning" and "whitespace" in finding.message
    assert finding.location == "messages[2].tool_calls[0].function.arguments"
    assert finding.char_offset == len('{"cmd":')

    reordered = copy.deepcopy(TURN_3)
    reordered["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"cwd": ".", "cmd": "ls"}'
    (finding, _) = lint_prompt(reordered, previous=TURN_2)
    assert finding.severity == "error" and "key order" in finding.message

    changed = copy.deepcopy(TURN_3)
    changed["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"cmd": "ls -l"}'
    (finding, _) = lint_prompt(changed, previous=TURN_2)
    assert finding.message.startswith("tool-call arguments changed")


def test_reasoning_dropped_on_replay() -> None:
    current = copy.deepcopy(TURN_3)
    del current["messages"][2]["reasoning_content"]
    findings = lint_prompt(current, previous=TURN_2)
    assert _kinds(findings) == ["reasoning_dropped", "prefix_divergence"]
    assert findings[0].location == "messages[2].reasoning_content"


def test_tool_call_id_changed_is_a_rewrite() -> None:
    current = copy.deepcopy(TURN_3)
    current["messages"][2]["tool_calls"][0]["id"] = "call_xyz"
    findings = lint_prompt(current, previous=TURN_2)
    assert findings[0].kind == "history_rewritten"
    assert findings[0].location == "messages[2].tool_calls[0]"


def test_role_change_and_message_key_order() -> None:
    current = copy.deepcopy(TURN_2)
    current["messages"][1] = {"content": "List files.", "role": "user"}
    (finding, _) = lint_prompt(current, previous=TURN_1)
    assert finding.kind == "history_rewritten" and "key order" in finding.message

    current["messages"][1] = {"role": "assistant", "content": "List files."}
    (finding, _) = lint_prompt(current, previous=TURN_1)
    assert finding.location == "messages[1].role"


def test_shorter_conversation_is_info_only() -> None:
    findings = lint_prompt(TURN_1, previous=TURN_2)
    assert _kinds(findings) == ["history_truncated"]
    assert not findings[0].prefix_breaking


def test_first_divergence_is_the_earliest_rewrite() -> None:
    current: dict[str, Any] = copy.deepcopy(TURN_3)
    current["messages"][1]["content"] = "List all files."
    current["messages"][3]["content"] = "changed"
    findings = lint_prompt(current, previous=TURN_2)
    assert _kinds(findings) == ["history_rewritten", "history_rewritten", "prefix_divergence"]
    assert findings[-1].message_index == 1
    assert findings[-1].char_offset == len("List ")
    assert findings[-1].token_offset is None  # no tokenizer given
