"""render_prompt: messages + tools -> text and token ids through a real tokenizer and template.

The tokenizer is trained here with the ``tokenizers`` library (byte-level BPE) and wrapped
as a transformers fast tokenizer with a ChatML-style template that renders tools with
``tojson`` — the same kind of template a served model carries.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentkv import CacheNamespace, lint_prompt, matched_prefix_tokens, stable_tools
from agentkv.prefix._render import RenderedPrompt, render_prompt, to_vllm_messages, to_vllm_tools
from tests.support.requires import require_module

transformers = require_module("transformers")
tokenizers = require_module("tokenizers")

# HF renders with trim_blocks, so a newline right after a block tag is written as {{ "\n" }}.
TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|im_start|>system\n# Tools"
    '{% for tool in tools %}{{ "\n" }}{{ tool | tojson }}{% endfor %}<|im_end|>\n{% endif %}'
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m.get('reasoning_content') %}<think>{{ m['reasoning_content'] }}</think>{% endif %}"
    "{{ m['content'] }}"
    '{% for c in m.get("tool_calls") or [] %}{{ "\n" }}<tool_call>'
    '{"name": {{ c["function"]["name"] | tojson }}, '
    '"arguments": {{ c["function"]["arguments"] | tojson }}}</tool_call>'
    "{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|bos|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
CORPUS = [
    "You are a careful coding agent. Use the tools to inspect and edit the repository.",
    '{"type": "function", "function": {"name": "read_file", "description": "Read a file."}}',
    "def main(): print('hello world')  # tests pass, 3 failed, error in src/app.py line 42",
    "Run the test suite and fix the failing tests. The tool returned exit code 0.",
    "<tool_call> arguments path cmd pytest -q grep TODO properties required string integer",
]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """A small byte-level BPE tokenizer with a chat template, built locally."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|im_end|>", pad_token="<|pad|>"
    )
    fast.chat_template = TEMPLATE
    return fast


TOOLS = stable_tools(
    [
        {
            "name": "run",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"cmd": {"type": "string"}},
                "required": ["cmd"],
            },
        },
        {"name": "read_file", "parameters": {"type": "object", "properties": {}}},
    ]
)
TURN_1 = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "Run the tests."},
]
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "run", "arguments": '{"cmd": "pytest -q"}'},
}
TURN_2 = [
    *TURN_1,
    {"role": "assistant", "content": "", "tool_calls": [CALL], "reasoning": "Tests first."},
    {"role": "tool", "tool_call_id": "call_1", "content": "3 passed"},
]


def test_render_gives_template_text_and_its_tokens(tokenizer: Any) -> None:
    rendered = render_prompt(tokenizer, TURN_1, TOOLS)
    assert isinstance(rendered, RenderedPrompt)
    assert rendered.text.startswith("<|bos|><|im_start|>system\n# Tools\n")
    assert json.dumps(TOOLS[1], ensure_ascii=False) in rendered.text  # "run": all fields
    assert rendered.text.endswith("<|im_start|>assistant\n")
    assert rendered.token_ids == tokenizer.encode(rendered.text, add_special_tokens=False)
    assert rendered.num_tokens == len(rendered.token_ids)
    assert tokenizer.decode(rendered.token_ids) == rendered.text


def test_second_turn_extends_the_first_turn_prefix(tokenizer: Any) -> None:
    one = render_prompt(tokenizer, TURN_1, TOOLS)
    two = render_prompt(tokenizer, TURN_2, TOOLS)
    assert two.text.startswith(one.text)
    assert two.token_ids[: len(one.token_ids)] == one.token_ids
    assert '<tool_call>{"name": "run", "arguments": {"cmd": "pytest -q"}}' in two.text
    assert "<think>Tests first.</think>" in two.text
    shared = matched_prefix_tokens(one.token_ids, two.token_ids, 4)
    assert shared == len(one.token_ids) // 4 * 4


def test_unstable_tool_order_changes_tokens_and_stable_tools_fixes_it(tokenizer: Any) -> None:
    raw = [TOOLS[1]["function"], TOOLS[0]["function"]]
    reordered = [{"type": "function", "function": dict(reversed(list(f.items())))} for f in raw]
    assert render_prompt(tokenizer, TURN_1, reordered).token_ids != (
        render_prompt(tokenizer, TURN_1, TOOLS).token_ids
    )
    assert render_prompt(tokenizer, TURN_1, stable_tools(reordered)).token_ids == (
        render_prompt(tokenizer, TURN_1, TOOLS).token_ids
    )


def test_vllm_preprocessing_of_messages_and_tools() -> None:
    messages = to_vllm_messages(
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning": "r"},
            {"role": "tool", "tool_call_id": "call_1", "content": "ok", "extra": 1},
        ]
    )
    assert messages[0] == {"role": "user", "content": "a\nb"}
    assert messages[1]["content"] == ""
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"cmd": "pytest -q"}
    assert messages[1]["reasoning"] == messages[1]["reasoning_content"] == "r"
    assert messages[2] == {"role": "tool", "content": "ok", "tool_call_id": "call_1"}
    assert CALL["function"]["arguments"] == '{"cmd": "pytest -q"}'  # input untouched
    tools = to_vllm_tools(stable_tools([{"name": "x"}]))
    assert tools == [
        {"type": "function", "function": {"name": "x", "description": None, "parameters": None}}
    ]


def test_invalid_arguments_render_as_empty_object() -> None:
    bad = {**CALL, "function": {"name": "run", "arguments": "{not json"}}
    (message,) = to_vllm_messages([{"role": "assistant", "content": "", "tool_calls": [bad]}])
    assert message["tool_calls"][0]["function"]["arguments"] == {}


def test_lint_reports_divergence_in_tokens(tokenizer: Any) -> None:
    previous = {"messages": TURN_2, "tools": TOOLS}
    edited = [dict(m) for m in TURN_2]
    edited[1] = {"role": "user", "content": "Run the unit tests."}
    current = {"messages": [*edited, {"role": "user", "content": "next"}], "tools": TOOLS}
    findings = lint_prompt(current, previous=previous, tokenizer=tokenizer)
    divergence = next(f for f in findings if f.kind == "prefix_divergence")
    assert divergence.message_index == 1 and divergence.char_offset == len("Run the ")
    before = render_prompt(tokenizer, TURN_2, TOOLS).token_ids
    after = render_prompt(tokenizer, current["messages"], TOOLS).token_ids
    expected = next(i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b)
    assert divergence.token_offset == expected
    assert f"token {expected}" in divergence.message


def test_lint_clean_extension_has_no_prefix_breaking_findings(tokenizer: Any) -> None:
    previous = {"messages": TURN_1, "tools": TOOLS}
    current = {"messages": TURN_2, "tools": TOOLS}
    findings = lint_prompt(current, previous=previous, tokenizer=tokenizer)
    assert not [f for f in findings if f.prefix_breaking]


def test_render_from_model_dir(tmp_path: Any, tokenizer: Any) -> None:
    tokenizer.save_pretrained(tmp_path)
    from_dir = render_prompt(str(tmp_path), TURN_1, TOOLS)
    assert from_dir == render_prompt(tokenizer, TURN_1, TOOLS)


def test_namespace_from_tokenizer_equals_namespace_from_its_directory(
    tmp_path: Any, tokenizer: Any
) -> None:
    tokenizer.save_pretrained(tmp_path)
    loaded = CacheNamespace.from_tokenizer(tokenizer, model="tiny", revision="r1")
    on_disk = CacheNamespace.from_model_dir(tmp_path, model="tiny", revision="r1")
    assert loaded.is_complete and loaded == on_disk
    other = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    other.chat_template = TEMPLATE.replace("# Tools", "# Functions")
    changed = CacheNamespace.from_tokenizer(other, model="tiny", revision="r1")
    assert changed.tokenizer_fingerprint == loaded.tokenizer_fingerprint
    assert changed.chat_template_fingerprint != loaded.chat_template_fingerprint
    assert changed != loaded


def test_lint_cli_with_tokenizer_prints_token_offsets(
    tmp_path: Any, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentkv.cli import main

    tokenizer.save_pretrained(tmp_path / "model")
    edited = [dict(m) for m in TURN_2]
    edited[1] = {"role": "user", "content": "Run the unit tests."}
    lines = [{"messages": TURN_2, "tools": TOOLS}, {"messages": edited, "tools": TOOLS}]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert main(["lint", str(path), "--tokenizer", str(tmp_path / "model")]) == 1
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "prefix_divergence" in line)
    assert f"{len('Run the ')}/t" in row and ", token " in row
    assert main(["lint", str(path), "--tokenizer", str(tmp_path / "missing")]) == 2
    assert "cannot load a tokenizer" in capsys.readouterr().err


def _template_dropping_old_reasoning(tokenizer: Any) -> Any:
    """A copy of the tokenizer whose template shows reasoning only after the last user turn."""
    dropping = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend_tokenizer, bos_token="<|bos|>"
    )
    last_user = (
        "{% set ns = namespace(last_user=-1) %}{% for m in messages %}"
        "{% if m['role'] == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}"
        "{% endfor %}"
    )
    dropping.chat_template = last_user + TEMPLATE.replace(
        "{% if m.get('reasoning_content') %}",
        "{% if m.get('reasoning_content') and loop.index0 > ns.last_user %}",
    )
    return dropping


def test_lint_finds_a_template_that_rewrites_history(tokenizer: Any) -> None:
    dropping = _template_dropping_old_reasoning(tokenizer)
    previous = {"messages": TURN_2, "tools": TOOLS}
    reply = {"role": "assistant", "content": "All 3 tests pass."}
    follow_up = {"role": "user", "content": "Now add one."}
    current = {"messages": [*TURN_2, reply, follow_up], "tools": TOOLS}
    # the messages are replayed exactly: nothing to report at the character level
    assert lint_prompt(current, previous=previous) == []
    findings = lint_prompt(current, previous=previous, tokenizer=dropping)
    (finding,) = findings
    assert finding.kind == "template_divergence" and finding.prefix_breaking
    before = render_prompt(dropping, TURN_2, TOOLS, add_generation_prompt=False)
    assert finding.token_offset is not None
    assert before.text.startswith(tokenizer.decode(before.token_ids[: finding.token_offset]))
    assert "<think>" in tokenizer.decode(before.token_ids[finding.token_offset :])
    # the template that keeps reasoning has no such finding
    assert lint_prompt(current, previous=previous, tokenizer=tokenizer) == []


def test_lint_reports_a_template_that_fails_to_render(tokenizer: Any) -> None:
    broken = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer)
    broken.chat_template = "{{ raise_exception('no tools here') }}"
    findings = lint_prompt(TURN_2, tools=TOOLS, previous=TURN_1, tokenizer=broken)
    assert [f.kind for f in findings] == ["render_failed"]
    rewritten = [TURN_1[0], {"role": "user", "content": "Other task."}]
    findings = lint_prompt(rewritten, tools=TOOLS, previous=TURN_1, tokenizer=broken)
    assert findings[-1].kind == "prefix_divergence"
    assert "no token offset: rendering failed" in findings[-1].message
